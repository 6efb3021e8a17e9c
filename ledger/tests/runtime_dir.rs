//! The runtime directory's checks through the public API: symlinks, planted files, modes and
//! owners are refused with a message saying what is wrong and how to fix it, and nothing a
//! refused path points to is ever created, truncated or written.

mod common;
use common::{fresh_dir, is_root, Scratch};
use gpuslice_ledger::{Ledger, LedgerError};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

/// Why `Ledger::open_or_create(rt)` is refused (the test fails if it is not).
fn refused(rt: &Path) -> LedgerError {
    Ledger::open_or_create(rt).err().expect("refused")
}

/// A new, empty directory of mode 0755 for one test.
fn dir(tag: &str) -> Scratch {
    let d = fresh_dir("rtdir", tag);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn a_planted_ledger_symlink_is_refused_and_its_target_untouched() {
    let d = dir("symlink");
    let target = d.join("precious");
    std::fs::write(&target, b"keep me").unwrap();
    let rt = d.join("rt");
    std::fs::create_dir(&rt).unwrap();
    symlink(&target, rt.join("ledger")).unwrap();
    let e = refused(&rt);
    assert!(
        matches!(e, LedgerError::UnsafeFile { .. }) && e.to_string().contains("symbolic link"),
        "{e}"
    );
    assert!(Ledger::open(&rt).is_err());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
}

#[test]
fn a_symlinked_directory_is_refused() {
    let d = dir("dirlink");
    let real = d.join("real");
    std::fs::create_dir(&real).unwrap();
    symlink(&real, d.join("rt")).unwrap();
    let e = refused(&d.join("rt"));
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(!real.join("ledger").exists());
}

#[test]
fn a_world_writable_directory_is_refused_with_the_fix() {
    let d = dir("mode");
    let rt = d.join("rt");
    std::fs::create_dir(&rt).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let e = refused(&rt).to_string();
    assert!(
        e.contains("writable by group or others") && e.contains("chmod 755"),
        "{e}"
    );
    assert!(!rt.join("ledger").exists());
}

#[test]
fn a_new_directory_and_ledger_are_private_to_their_owner() {
    let d = dir("fresh");
    let rt = d.join("a/b/rt");
    let l = Ledger::open_or_create(&rt).unwrap();
    assert!(l.writable());
    let dm = std::fs::metadata(&rt).unwrap().permissions().mode() & 0o7777;
    let fm = std::fs::metadata(rt.join("ledger"))
        .unwrap()
        .permissions()
        .mode()
        & 0o7777;
    assert_eq!(dm & 0o022, 0, "directory mode {dm:o}");
    assert_eq!(fm, 0o600, "ledger mode {fm:o}");
}

#[test]
fn a_ledger_writable_by_others_is_refused() {
    let d = dir("filemode");
    let rt = d.join("rt");
    drop(Ledger::open_or_create(&rt).unwrap());
    std::fs::set_permissions(rt.join("ledger"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = Ledger::open(&rt).err().expect("refused").to_string();
    assert!(e.contains("writable by group or others"), "{e}");
}

#[test]
fn files_or_directories_of_another_user_are_refused() {
    if !is_root() {
        println!("skipped: needs root to chown files to another user");
        return;
    }
    let d = dir("owner");
    let rt = d.join("rt");
    drop(Ledger::open_or_create(&rt).unwrap());
    let c = |p: &Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let path = c(&rt.join("ledger"));
    // SAFETY: `path` is a valid NUL-terminated path that outlives the call.
    let rc = unsafe { libc::chown(path.as_ptr(), 4242, 4242) };
    assert_eq!(rc, 0);
    let e = Ledger::open(&rt).err().expect("refused").to_string();
    assert!(e.contains("owned by uid 4242"), "{e}");
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::chown(c(&rt).as_ptr(), 4242, 4242) }, 0);
    let e = refused(&rt).to_string();
    assert!(
        e.contains("owned by uid 4242") && e.contains("gpuslice monitor"),
        "{e}"
    );
}

#[test]
fn a_relative_runtime_dir_is_refused() {
    let e = refused(Path::new("relative/dir"));
    assert!(matches!(e, LedgerError::RelativeRuntimeDir(_)), "{e}");
    assert!(e.to_string().contains("absolute"));
    assert!(!Path::new("relative").exists());
}
