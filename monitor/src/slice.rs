//! `gpuslice slice create|rm|ls`: slices an operator defines ahead of the processes that use
//! them. A process naming such a slice (`GPUSLICE_SLICE`) gets the operator's quota and share;
//! its own variables cannot raise them (the ledger enforces that at attach).
//!
//! Admission happens in the ledger, under its lock, against what the device has left: the
//! memory of all slices on a device never exceeds it, nor do compute guarantees sum past 1.

use crate::cli::{self, Command, Failure};
use crate::commands;
use crate::ledger_window::slices::{SecretArg, SliceSpec};
use crate::ledger_window::LedgerWindow;
use crate::view::SliceView;
use gpuslice_quantity::{
    check_cap_not_below_share, check_slice_name, parse_cap, parse_fraction, parse_quota, Cap,
    ComputeSetting, PerDevice, Share,
};
use std::ffi::OsString;

const USAGE: &Command = &commands::SLICE;
const CREATE: &Command = &commands::SLICE_CREATE;
const SET: &Command = &commands::SLICE_SET;
const RM: &Command = &commands::SLICE_RM;
const LS: &Command = &commands::SLICE_LS;

/// Entry point of `gpuslice slice`.
pub fn main(mut args: Vec<OsString>) -> i32 {
    if args.is_empty() {
        return Failure::usage("missing subcommand: create, set, rm or ls", USAGE).report();
    }
    let sub = args.remove(0);
    cli::exit_status(match sub.to_str() {
        Some("create") => create(args),
        Some("set") => set(args),
        Some("rm" | "remove" | "delete") => rm(args),
        Some("ls" | "list") => ls(args),
        Some("--help" | "-h" | "help") => cli::outln!("{}", USAGE.help()),
        _ => Err(Failure::usage(
            format!("unknown subcommand {sub:?}: expected create, set, rm or ls"),
            USAGE,
        )),
    })
}

/// Parse `slice create`'s arguments (no side effects; `--help` is [`Failure::Helped`]).
pub(crate) fn parse_create(args: Vec<OsString>) -> Result<SliceSpec, Failure> {
    use lexopt::Arg::*;
    let mut p = cli::Args::new(args, CREATE);
    let (mut name, mut memory, mut compute, mut cap, mut device) = (None, None, None, None, None);
    let mut owner = None;
    let mut secret: Option<SecretArg> = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("memory") => {
                let v = p.utf8("--memory")?;
                let q = parse_quota("--memory", &v)
                    .map_err(|e| Failure::usage(e.to_string(), CREATE))?;
                cli::once(&mut memory, "--memory", q, CREATE)?;
            }
            Long("compute") => {
                let v = p.utf8("--compute")?;
                let share = parse_fraction("--compute", &v)
                    .map_err(|e| Failure::usage(e.to_string(), CREATE))?;
                cli::once(&mut compute, "--compute", (share, v), CREATE)?;
            }
            Long("compute-cap") => {
                let v = p.utf8("--compute-cap")?;
                let c = parse_cap("--compute-cap", &v)
                    .map_err(|e| Failure::usage(e.to_string(), CREATE))?;
                cli::once(&mut cap, "--compute-cap", (c, v), CREATE)?;
            }
            Long("device") => {
                let v = p.utf8("--device")?;
                cli::check_device("--device", &v, CREATE)?;
                cli::once(&mut device, "--device", v, CREATE)?;
            }
            Long("owner") => {
                let v = p.utf8("--owner")?;
                if owner.is_some() {
                    return Err(Failure::usage(
                        "--owner is given twice; give it once",
                        CREATE,
                    ));
                }
                owner = Some(uid_of(&v).ok_or_else(|| {
                    Failure::usage(
                        format!("--owner {v:?}: no such user (a uid or a user name)"),
                        CREATE,
                    )
                })?);
            }
            Long(flag @ ("secret-file" | "new-secret-file")) => {
                let flag = format!("--{flag}");
                let v = std::path::PathBuf::from(p.value()?);
                if v.as_os_str().is_empty() {
                    return Err(Failure::usage(format!("{flag} needs a file path"), CREATE));
                }
                if secret.is_some() {
                    return Err(Failure::usage(
                        "one secret per slice: give --secret-file or --new-secret-file, once",
                        CREATE,
                    ));
                }
                secret = Some(if flag == "--secret-file" {
                    SecretArg::File(v)
                } else {
                    SecretArg::New(v)
                });
            }
            Value(v) if name.is_none() => name = Some(cli::utf8(v, "NAME", CREATE)?),
            _ => return Err(Failure::usage(arg.unexpected().to_string(), CREATE)),
        }
    }
    let name = name.ok_or_else(|| Failure::usage("missing the slice's NAME", CREATE))?;
    check_slice_name("NAME", &name).map_err(|e| Failure::usage(e.to_string(), CREATE))?;
    let memory = memory.ok_or_else(|| {
        Failure::usage(
            format!("missing --memory for slice {name:?} (e.g. --memory 4Gi or --memory 25%)"),
            CREATE,
        )
    })?;
    if let (Some((share, share_value)), Some((cap, cap_value))) = (&compute, &cap) {
        check_cap_not_below_share(
            ComputeSetting {
                setting: "--compute",
                value: share_value,
                parsed: &PerDevice::All(*share),
            },
            ComputeSetting {
                setting: "--compute-cap",
                value: cap_value,
                parsed: &PerDevice::All(*cap),
            },
        )
        .map_err(|e| Failure::usage(e.to_string(), CREATE))?;
    }
    let (compute, cap) = (compute.map(|c| c.0), cap.map(|c| c.0));
    Ok(SliceSpec {
        name,
        memory,
        compute: compute.unwrap_or(Share::NONE),
        cap: cap.unwrap_or(Cap::NONE),
        device: device.unwrap_or_else(|| "0".into()),
        owner,
        secret,
    })
}

/// A uid given as digits or as a user name.
fn uid_of(v: &str) -> Option<u32> {
    if let Ok(u) = v.parse::<u32>() {
        return (u != gpuslice_ledger::layout::ANY_UID).then_some(u);
    }
    let c = std::ffi::CString::new(v).ok()?;
    // SAFETY: valid name; getpwnam returns null or a pointer to static data read at once.
    let p = unsafe { libc::getpwnam(c.as_ptr()) };
    // SAFETY: non-null pointer from getpwnam.
    (!p.is_null()).then(|| unsafe { (*p).pw_uid })
}

/// Parse `slice set`'s arguments (no side effects; `--help` is [`Failure::Helped`]).
pub(crate) fn parse_set(
    args: Vec<OsString>,
) -> Result<(String, gpuslice_ledger::SliceChange), Failure> {
    use lexopt::Arg::*;
    let mut p = cli::Args::new(args, SET);
    let mut name = None;
    let mut c = gpuslice_ledger::SliceChange::default();
    let bad = |e: &dyn std::fmt::Display| Failure::usage(e.to_string(), SET);
    while let Some(arg) = p.next()? {
        match arg {
            Long("memory") => {
                let v = p.utf8("--memory")?;
                c.memory = Some(
                    match gpuslice_quantity::parse_quota("--memory", &v).map_err(|e| bad(&e))? {
                        gpuslice_quantity::Size::Bytes(b) => b,
                        other => {
                            return Err(Failure::usage(
                                format!(
                                "--memory {v:?}: slice set takes bytes (e.g. 4Gi), got {other:?}"
                            ),
                                SET,
                            ))
                        }
                    },
                );
            }
            Long("compute") => {
                let v = p.utf8("--compute")?;
                c.compute_share = Some(parse_fraction("--compute", &v).map_err(|e| bad(&e))?);
            }
            Long("compute-cap") => {
                let v = p.utf8("--compute-cap")?;
                c.compute_cap = Some(parse_cap("--compute-cap", &v).map_err(|e| bad(&e))?);
            }
            Long("priority") => {
                let v = p.utf8("--priority")?;
                c.class =
                    Some(cli::priority_class(&v).map_err(|e| Failure::usage(e.to_string(), SET))?);
            }
            Value(v) if name.is_none() => name = Some(cli::utf8(v, "NAME", SET)?),
            _ => return Err(Failure::usage(arg.unexpected().to_string(), SET)),
        }
    }
    let name = name.ok_or_else(|| Failure::usage("missing the slice's NAME", SET))?;
    if c == gpuslice_ledger::SliceChange::default() {
        return Err(Failure::usage(
            format!("nothing to change for slice {name:?}: give --memory, --compute, --compute-cap or --priority"),
            SET,
        ));
    }
    Ok((name, c))
}

/// `slice set`: change a slice live (running processes see it at their next allocation or
/// turn); admission is re-checked by the ledger.
fn set(args: Vec<OsString>) -> Result<(), Failure> {
    let (name, change) = parse_set(args)?;
    let node = LedgerWindow::open(&cli::runtime_dir())?;
    let n = node.set_slice(&name, &change)?;
    cli::outln!(
        "changed slice {name:?} ({n} device{})",
        if n == 1 { "" } else { "s" }
    )
}

/// Take `--priority P` (or `--priority=P`) out of `slice create`'s arguments: the class is set
/// on the new slice right after it is created.
pub(crate) fn take_priority(args: &mut Vec<OsString>) -> Result<Option<u32>, Failure> {
    let mut class = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        let v = if a == "--priority" {
            let v = args.get(i + 1).map(|v| v.to_string_lossy().into_owned());
            args.drain(i..(i + 2).min(args.len()));
            v.ok_or_else(|| Failure::usage("--priority needs a value: latency or normal", CREATE))?
        } else if let Some(v) = a.strip_prefix("--priority=") {
            let v = v.to_string();
            args.remove(i);
            v
        } else {
            i += 1;
            continue;
        };
        class = Some(cli::priority_class(&v).map_err(|e| Failure::usage(e.to_string(), CREATE))?);
    }
    Ok(class)
}

fn create(mut args: Vec<OsString>) -> Result<(), Failure> {
    let class = take_priority(&mut args)?;
    let req = parse_create(args)?;
    let dir = cli::runtime_dir();
    // A tenant's view of a node policy is read-only: its request goes to the monitor.
    let node = match LedgerWindow::open(&dir) {
        Err(e) if LedgerWindow::is_missing(&e) => LedgerWindow::open_or_create(&dir)?,
        other => other?,
    };
    let s = node.create_operator_slice(&req)?;
    if let Some(class) = class {
        let change = gpuslice_ledger::SliceChange {
            class: Some(class),
            ..Default::default()
        };
        node.set_slice(&s.name, &change)?;
    }
    cli::outln!(
        "created slice {:?} on GPU {}: memory {}, compute share {}, cap {}",
        s.name,
        node.snapshot()
            .device(&s.device_uuid)
            .map_or(s.device_uuid.clone(), |d| format!(
                "{} ({})",
                d.index, d.uuid
            )),
        crate::table::size(s.memory_limit.unwrap_or(0)),
        if s.compute_share > 0.0 {
            crate::table::percent(s.compute_share)
        } else {
            "best effort".into()
        },
        if s.compute_cap < 1.0 {
            crate::table::percent(s.compute_cap)
        } else {
            "none".into()
        },
    )?;
    if let Some(SecretArg::File(p) | SecretArg::New(p)) = &req.secret {
        cli::outln!(
            "joining it needs the secret in {} (as {} in the process's environment; root \
             joins without)",
            p.display(),
            gpuslice_ledger::secret::SECRET_VAR
        )?;
    }
    Ok(())
}

fn rm(args: Vec<OsString>) -> Result<(), Failure> {
    use lexopt::Arg::*;
    let mut p = cli::Args::new(args, RM);
    let mut name = None;
    while let Some(arg) = p.next()? {
        match arg {
            Value(v) if name.is_none() => name = Some(cli::utf8(v, "NAME", RM)?),
            _ => return Err(Failure::usage(arg.unexpected().to_string(), RM)),
        }
    }
    let name = name.ok_or_else(|| Failure::usage("missing the slice's NAME", RM))?;
    let node = LedgerWindow::open(&cli::runtime_dir())?;
    let removed = node.remove_slice(&name)?;
    if removed == 0 {
        cli::outln!(
            "slice {name:?} is no longer operator-defined; it goes away with its last process \
             (or the last importer of memory exported from it)"
        )
    } else {
        cli::outln!("removed slice {name:?}")
    }
}

fn ls(args: Vec<OsString>) -> Result<(), Failure> {
    let json = cli::json_flag(args, LS)?;
    let mut snap = crate::status::load(&cli::runtime_dir())?;
    snap.slices.retain(|s: &SliceView| s.operator);
    snap.processes.clear();
    if json {
        return cli::outln!(
            "{}",
            serde_json::json!({ "slices": snap.to_json()["slices"] })
        );
    }
    let lines = crate::table::render(&snap);
    // The slice table only: it starts at its header and ends at the blank line.
    let start = lines
        .iter()
        .position(|l| l.starts_with("SLICE"))
        .unwrap_or(0);
    for l in lines[start..].iter().take_while(|l| !l.is_empty()) {
        cli::outln!("{l}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::test_args as args;

    #[test]
    fn create_and_set_take_a_priority() {
        let mut a = args(&["s", "--memory", "1Gi", "--priority", "latency"]);
        assert_eq!(
            take_priority(&mut a).unwrap(),
            Some(gpuslice_sched::CLASS_LATENCY)
        );
        assert_eq!(a, args(&["s", "--memory", "1Gi"]));
        let mut a = args(&["s", "--priority=normal"]);
        assert_eq!(
            take_priority(&mut a).unwrap(),
            Some(gpuslice_sched::CLASS_NORMAL)
        );
        assert!(take_priority(&mut args(&["s", "--priority", "high"])).is_err());
        assert!(take_priority(&mut args(&["s", "--priority"])).is_err());
        let (name, c) =
            parse_set(args(&["s", "--priority", "latency", "--compute", "0.5"])).unwrap();
        assert_eq!(name, "s");
        assert_eq!(c.class, Some(gpuslice_sched::CLASS_LATENCY));
        assert_eq!(c.compute_share, Some(Share::from_ppm(500_000)));
        assert!(parse_set(args(&["s"])).is_err(), "nothing to change");
    }

    #[test]
    fn help_parses_nothing_further() {
        let helped = |r: Result<(), Failure>| matches!(r, Err(Failure::Helped));
        assert!(helped(
            parse_create(args(&["a", "--help", "--memory"])).map(drop)
        ));
        assert!(helped(parse_set(args(&["-h"])).map(drop)));
    }

    fn usage_error(a: &[&str]) -> String {
        match parse_create(args(a)) {
            Err(Failure::Usage { msg, .. }) => msg,
            other => panic!("{a:?} gave {other:?}"),
        }
    }

    #[test]
    fn create_parses_every_flag() {
        let r = parse_create(args(&[
            "train",
            "--memory",
            "2Gi",
            "--compute",
            "25%",
            "--compute-cap=0.5",
            "--device",
            "1",
        ]))
        .unwrap();
        assert_eq!(r.name, "train");
        assert_eq!(r.compute, Share::from_ppm(250_000));
        assert_eq!(r.cap, Cap::from_ppm(500_000));
        assert_eq!(r.device, "1");
        assert_eq!(r.memory.resolve(16 << 30), 2 << 30);
    }

    #[test]
    fn create_refuses_bad_usage_naming_the_flag() {
        assert!(usage_error(&["--memory", "1Gi"]).contains("NAME"));
        assert!(usage_error(&["a"]).contains("--memory"));
        assert!(usage_error(&["a", "--memory", "12XB"]).contains("12XB"));
        assert!(usage_error(&["a", "--memory", "1Gi", "--compute", "1.5"]).contains("--compute"));
        assert!(
            usage_error(&["a", "--memory", "1Gi", "--compute-cap", "0"]).contains("--compute-cap")
        );
        assert!(usage_error(&[
            "a",
            "--memory",
            "1Gi",
            "--compute",
            "0.5",
            "--compute-cap",
            "0.2"
        ])
        .contains("below"));
        assert!(usage_error(&["a", "--memory", "1Gi", "--bogus"]).contains("--bogus"));
        assert!(usage_error(&["a", "b", "--memory", "1Gi"]).contains("b"));
        assert!(usage_error(&["a b", "--memory", "1Gi"]).contains("NAME"));
        assert!(usage_error(&["pid-7", "--memory", "1Gi"]).contains("pid-"));
        // One rule for 0 with the shim's GPUSLICE_MEMORY: never a quota.
        assert!(usage_error(&["a", "--memory", "0"]).contains("0 bytes"));
        assert!(usage_error(&["a", "--memory", "0Gi"]).contains("0 bytes"));
        // A repeated flag is bad usage, never a silent choice.
        for flag in ["--memory", "--compute", "--compute-cap", "--device"] {
            let msg = usage_error(&["a", "--memory", "1Gi", flag, "1", flag, "1"]);
            assert!(msg.contains("twice"), "{flag}: {msg}");
        }
        // A device is an index or a UUID.
        for bad in ["-1", "", "x", "0x1", "GPU-"] {
            let msg = usage_error(&["a", "--memory", "1Gi", "--device", bad]);
            assert!(msg.contains("--device"), "{bad:?}: {msg}");
        }
        for good in ["0", "12", "GPU-fa4e0000-0000-4000-8000-000000000000"] {
            assert!(parse_create(args(&["a", "--memory", "1Gi", "--device", good])).is_ok());
        }
    }

    #[test]
    fn create_takes_one_secret_source() {
        let r = parse_create(args(&["a", "--memory", "1Gi", "--secret-file", "/s"])).unwrap();
        assert_eq!(r.secret, Some(SecretArg::File("/s".into())));
        let r = parse_create(args(&["a", "--memory", "1Gi", "--new-secret-file=/n"])).unwrap();
        assert_eq!(r.secret, Some(SecretArg::New("/n".into())));
        let r = parse_create(args(&["a", "--memory", "1Gi"])).unwrap();
        assert_eq!(r.secret, None);
        let msg = usage_error(&[
            "a",
            "--memory",
            "1Gi",
            "--secret-file",
            "/s",
            "--new-secret-file",
            "/n",
        ]);
        assert!(msg.contains("one secret"), "{msg}");
        assert!(usage_error(&["a", "--memory", "1Gi", "--secret-file", ""]).contains("path"));
        assert!(usage_error(&["a", "--memory", "1Gi", "--secret-file"]).contains("secret-file"));
    }
}
