use super::*;
use std::os::unix::fs::PermissionsExt;

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gpuslice-secret-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

#[test]
fn secrets_are_parsed_strictly_and_never_shown_by_debug() {
    let good = "0123456789abcdef0123456789abcdef";
    let s = Secret::parse("X", good).unwrap();
    assert_eq!(s.expose(), good);
    assert!(!format!("{s:?}").contains("0123"), "{s:?}");
    for bad in [
        "",
        "short",
        &good[1..],
        &"a".repeat(MAX_LEN + 1),
        "0123456789abcdef 0123456789abcdef",
        "0123456789abcdef\t0123456789abcdef",
        "0123456789abcdef\n0123456789abcdef",
        "0123456789abcdef0123456789abcdeé",
    ] {
        let e = Secret::parse("GPUSLICE_SLICE_SECRET", bad).unwrap_err();
        assert!(
            e.to_string().contains("GPUSLICE_SLICE_SECRET"),
            "{bad:?}: {e}"
        );
    }
    assert!(Secret::parse("X", "aGVsbG8gd29ybGQsIGhlbGxvIHdvcmxkIQ==+/").is_ok());
}

#[test]
fn generated_secrets_are_256_random_bits() {
    let a = Secret::generate().unwrap();
    let b = Secret::generate().unwrap();
    assert_eq!(a.expose().len(), 64);
    assert!(a.expose().bytes().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a, b);
    assert!(Secret::parse("x", a.expose()).is_ok());
}

#[test]
fn comparison_is_exact_and_constant_time_shaped() {
    let s = Secret::parse("x", &"k".repeat(40)).unwrap();
    assert!(s.matches(&"k".repeat(40)));
    assert!(!s.matches(&"k".repeat(39)));
    assert!(!s.matches(&"k".repeat(41)));
    assert!(!s.matches(&format!("{}j", "k".repeat(39))));
    assert!(!s.matches(""));
    assert!(ct_eq(b"", b""));
    assert!(!ct_eq(b"a", b""));
    // A longer string that agrees on the shorter one's bytes plus NULs is still different.
    assert!(!ct_eq(b"ab", b"ab\0"));
}

#[test]
fn secret_files_must_be_private_and_are_written_private() {
    let d = tmpdir("file");
    let p = d.join("s");
    let s = Secret::generate().unwrap();
    s.write_new_file(&p).unwrap();
    let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(Secret::read_file(&p).unwrap(), s);
    // Never overwrites.
    assert!(Secret::generate().unwrap().write_new_file(&p).is_err());
    // A readable file is refused, naming the fix.
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Secret::read_file(&p).unwrap_err().to_string();
    assert!(e.contains("chmod 600") && e.contains("read"), "{e}");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
    let e = Secret::read_file(&p).unwrap_err().to_string();
    assert!(e.contains("write"), "{e}");
    // Someone else's file (root only can give one away): refused, naming its owner.
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    if crate::dir::euid() == 0 {
        std::os::unix::fs::chown(&p, Some(47001), None).unwrap();
        let e = Secret::read_file(&p).unwrap_err().to_string();
        assert!(e.contains("owned by uid 47001"), "{e}");
        std::os::unix::fs::chown(&p, Some(0), None).unwrap();
    }
    // A symlink is not followed.
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&p, d.join("link")).unwrap();
    assert!(Secret::read_file(&d.join("link")).is_err());
    // One trailing newline (and CR) is dropped; a second line is not a secret.
    std::fs::write(&p, format!("{}\r\n", s.expose())).unwrap();
    assert_eq!(Secret::read_file(&p).unwrap(), s);
    std::fs::write(&p, format!("{}\nmore\n", s.expose())).unwrap();
    assert!(Secret::read_file(&p).is_err());
    let _ = std::fs::remove_dir_all(&d);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 2000,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// The store's text is read from disk: any text parses or is refused, never a panic,
    /// and what it writes it reads back.
    #[test]
    fn any_store_text_parses_or_is_refused(text in "(?s).{0,400}", name in "[a-z][a-z0-9-]{0,20}") {
        let _ = Store::parse(&text);
        let mut st = Store::default();
        st.set(&name, Some(Secret::generate().unwrap()));
        proptest::prop_assert_eq!(Store::parse(&st.text()), Ok(st));
    }

    /// Any string is a valid secret or a refusal that does not contain it.
    #[test]
    fn any_value_is_a_secret_or_a_refusal_without_it(v in "(?s).{0,300}") {
        match Secret::parse("V", &v) {
            Ok(s) => proptest::prop_assert!(s.matches(&v)),
            Err(e) => proptest::prop_assert!(v.len() < MIN_LEN || !e.to_string().contains(&v)),
        }
    }
}

#[test]
fn the_store_is_one_private_file_replaced_whole() {
    let d = tmpdir("store");
    let dir = RuntimeDir::open(&d).unwrap();
    assert_eq!(Store::load(&dir).unwrap(), Store::default());
    let mut st = Store::default();
    let (a, b) = (Secret::generate().unwrap(), Secret::generate().unwrap());
    assert!(st.set("a", Some(a.clone())));
    assert!(!st.set("a", Some(a.clone())));
    assert!(st.set("b", Some(b.clone())));
    st.save(&dir).unwrap();
    let path = d.join(SECRETS_FILE);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!d.join(format!("{SECRETS_FILE}.tmp")).exists());
    let back = Store::load(&dir).unwrap();
    assert_eq!(back.get("a"), Some(&a));
    assert_eq!(back.get("b"), Some(&b));
    assert!(back.get("c").is_none());
    let mut back = back;
    assert!(back.retain(|n| n == "b"));
    assert!(back.set("b", None));
    back.save(&dir).unwrap();
    assert_eq!(Store::load(&dir).unwrap(), Store::default());
    // Readable by others: refused, never used.
    st.save(&dir).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = Store::load(&dir).unwrap_err().to_string();
    assert!(e.contains("readable by group or others"), "{e}");
    // A symlink planted in its place is refused.
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
    assert!(Store::load(&dir).is_err());
    // A stale temporary file (a crash mid-save) does not block the next save.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(d.join(format!("{SECRETS_FILE}.tmp")), b"junk").unwrap();
    st.save(&dir).unwrap();
    assert_eq!(Store::load(&dir).unwrap().get("a"), Some(&a));
    // Garbage is refused with its line, never half-used.
    std::fs::write(&path, format!("a\t{}\nno-tab\n", a.expose())).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = Store::load(&dir).unwrap_err().to_string();
    assert!(e.contains("line 2"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
