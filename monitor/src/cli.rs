//! What every subcommand shares: the exit statuses of the contract, the error type that carries
//! them, and the runtime directory.

pub use crate::commands::Command;
use crate::error::{Error, SettingError};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bad usage: a wrong flag, a missing or malformed value.
pub const EXIT_USAGE: i32 = 2;
/// Any other failure (the ledger, the device, the system).
pub const EXIT_FAILURE: i32 = 1;

/// Why a subcommand stopped before its work was done; decides the exit status and how the
/// message is shown.
#[derive(Debug)]
pub enum Failure {
    /// Exit 0: `--help` was asked and answered ([`Args::next`]); nothing else runs.
    Helped,
    /// Exit 2: the message, then the subcommand's usage line.
    Usage {
        /// What was wrong, naming the flag and the value.
        msg: String,
        /// The subcommand, whose usage line follows the message.
        usage: &'static Command,
    },
    /// Exit 1: the message names what failed.
    Other(String),
}

impl Failure {
    /// A usage error for a subcommand.
    pub fn usage(msg: impl Into<String>, usage: &'static Command) -> Failure {
        Failure::Usage {
            msg: msg.into(),
            usage,
        }
    }

    /// What is shown for it (empty for [`Failure::Helped`]).
    pub fn message(&self) -> &str {
        match self {
            Failure::Helped => "",
            Failure::Usage { msg, .. } | Failure::Other(msg) => msg,
        }
    }

    /// Print the failure on stderr and return the exit status.
    pub fn report(&self) -> i32 {
        match self {
            Failure::Helped => 0,
            Failure::Usage { msg, usage } => {
                eprintln!(
                    "gpuslice: {msg}\n{}\n(`gpuslice {} --help` says more)",
                    usage.usage(),
                    usage.name
                );
                EXIT_USAGE
            }
            Failure::Other(msg) => {
                eprintln!("gpuslice: {msg}");
                EXIT_FAILURE
            }
        }
    }
}

impl From<Error> for Failure {
    /// Shown on the operator's terminal, exit status 1.
    fn from(e: Error) -> Failure {
        Failure::Other(e.to_string())
    }
}

impl From<String> for Failure {
    fn from(msg: String) -> Failure {
        Failure::Other(msg)
    }
}

/// Run a subcommand body and turn its outcome into an exit status.
pub fn exit_status(result: Result<(), Failure>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(f) => f.report(),
    }
}

/// Write one line to stdout. A reader that went away (`| head`) is not a failure: the rest of
/// the output has nowhere to go, as for any Unix tool. Another write error (`> /dev/full`) is
/// one, naming stdout, where `println!` would panic.
pub fn write_line(args: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    use std::io::Write;
    // Unit tests print through the harness, which keeps a passing test's output to itself.
    if cfg!(test) {
        println!("{args}");
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Failure::Other(format!("writing to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

/// `println!` through [`write_line`]: evaluates to `Result<(), Failure>`.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// A parser over a subcommand's arguments.
pub fn parser(args: Vec<OsString>) -> lexopt::Parser {
    lexopt::Parser::from_args(args)
}

/// A subcommand's arguments, `--help` answered and flags checked against the subcommand's
/// definition ([`crate::commands`]): the one place `--help`/`-h` is answered, a flag the
/// definition does not name is refused, and bad usage is tied to the usage line.
pub struct Args {
    /// The arguments; [`Args::value`] reads a flag's value.
    pub parser: lexopt::Parser,
    /// The subcommand.
    pub usage: &'static Command,
}

impl Args {
    /// The arguments of subcommand `usage`.
    pub fn new(args: Vec<OsString>, usage: &'static Command) -> Args {
        Args {
            parser: parser(args),
            usage,
        }
    }

    /// The next argument, `None` at the end. `--help`/`-h` prints the subcommand's help on
    /// stdout and ends the subcommand: [`Failure::Helped`], exit 0. A flag its definition does
    /// not name is bad usage.
    pub fn next(&mut self) -> Result<Option<lexopt::Arg<'_>>, Failure> {
        let arg = self.parser.next().map_err(lex(self.usage))?;
        match &arg {
            Some(a) if is_help(a) => {
                outln!("{}", self.usage.help())?;
                Err(Failure::Helped)
            }
            Some(a @ (lexopt::Arg::Long(_) | lexopt::Arg::Short(_)))
                if self.usage.flag(a).is_none() =>
            {
                Err(Failure::usage(
                    format!(
                        "{} is not a flag of `gpuslice {}`",
                        flag_text(a),
                        self.usage.name
                    ),
                    self.usage,
                ))
            }
            _ => Ok(arg),
        }
    }

    /// The value of the flag just read.
    pub fn value(&mut self) -> Result<OsString, Failure> {
        self.parser.value().map_err(lex(self.usage))
    }

    /// The value of the flag just read, as UTF-8 (bad usage naming `flag` if it is not).
    pub fn utf8(&mut self, flag: &str) -> Result<String, Failure> {
        let v = self.value()?;
        utf8(v, flag, self.usage)
    }
}

/// `--name` or `-c`, as typed.
fn flag_text(a: &lexopt::Arg<'_>) -> String {
    match a {
        lexopt::Arg::Long(n) => format!("--{n}"),
        lexopt::Arg::Short(c) => format!("-{c}"),
        lexopt::Arg::Value(v) => v.to_string_lossy().into_owned(),
    }
}

/// The arguments of a subcommand whose one option is `--json`: whether it was given.
pub fn json_flag(args: Vec<OsString>, usage: &'static Command) -> Result<bool, Failure> {
    let mut json = false;
    let mut args = Args::new(args, usage);
    while let Some(arg) = args.next()? {
        match arg {
            lexopt::Arg::Long("json") => json = true,
            _ => return Err(Failure::usage(arg.unexpected().to_string(), usage)),
        }
    }
    Ok(json)
}

/// Map a lexopt error (unknown flag, missing value, bad encoding) to a usage failure.
pub fn lex(usage: &'static Command) -> impl Fn(lexopt::Error) -> Failure {
    move |e| Failure::usage(e.to_string(), usage)
}

/// A flag's value as UTF-8, or a usage failure naming the flag.
pub fn utf8(v: OsString, flag: &str, usage: &'static Command) -> Result<String, Failure> {
    v.into_string()
        .map_err(|v| Failure::usage(format!("{flag}: {v:?} is not valid UTF-8"), usage))
}

/// Store a flag's value in `slot`, refusing a flag given twice: `--memory 1Gi --memory 2Gi`
/// is bad usage (exit 2) rather than a silent choice of one of them. The one rule for every
/// subcommand's repeated flags.
pub fn once<T>(
    slot: &mut Option<T>,
    flag: &str,
    value: T,
    usage: &'static Command,
) -> Result<(), Failure> {
    if slot.is_some() {
        return Err(Failure::usage(
            format!("{flag} is given twice; give it once"),
            usage,
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// An `--interval`-style value: whole milliseconds within `range`, stored once in `slot` (a
/// malformed, out-of-range or repeated value is bad usage naming the flag).
pub fn millis(
    slot: &mut Option<std::time::Duration>,
    flag: &str,
    value: &str,
    range: std::ops::RangeInclusive<u64>,
    usage: &'static Command,
) -> Result<(), Failure> {
    match value.parse::<u64>() {
        Ok(ms) if range.contains(&ms) => {
            once(slot, flag, std::time::Duration::from_millis(ms), usage)
        }
        _ => Err(Failure::usage(
            format!(
                "{flag} {value:?}: expected milliseconds between {} and {}",
                range.start(),
                range.end()
            ),
            usage,
        )),
    }
}

/// Check the form of a `--device` value: a device index (`0`, `1`, ... as NVML numbers
/// devices) or a device UUID (`GPU-...`, `MIG-...`). Whether such a device exists is decided
/// later, against the node (exit 1); a value of the wrong form (`-1`, empty) is bad usage.
pub fn check_device(flag: &str, value: &str, usage: &'static Command) -> Result<(), Failure> {
    let index = !value.is_empty() && value.len() <= 3 && value.bytes().all(|b| b.is_ascii_digit());
    let uuid = (value.starts_with("GPU-") || value.starts_with("MIG-"))
        && value.len() > 4
        && value.len() < gpuslice_ledger::layout::NAME_LEN
        && value[4..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-/".contains(&b));
    if index || uuid {
        return Ok(());
    }
    Err(Failure::usage(
        format!("{flag} {value:?}: expected a device index (0, 1, ...) or a UUID (GPU-...)"),
        usage,
    ))
}

/// `$GPUSLICE_RUNTIME_DIR`, or the default (`/dev/shm/gpuslice`; see the ledger crate). A
/// relative value is refused where the directory is opened, with the shim's message.
pub fn runtime_dir() -> PathBuf {
    gpuslice_ledger::runtime_dir_from_env()
        .unwrap_or_else(|_| gpuslice_ledger::dir::runtime_dir_var().unwrap_or_default())
}

/// `--priority`'s value as the scheduler's class (`latency` or `normal`): the one parse of the
/// flag, for `run`, `cdi` and `slice create|set`.
pub fn priority_class(value: &str) -> Result<u32, SettingError> {
    gpuslice_sched::parse_class(value).ok_or_else(|| SettingError::Priority(value.to_string()))
}

/// Whether `--help`/`-h` was asked; subcommands print their usage and exit 0.
pub fn is_help(arg: &lexopt::Arg<'_>) -> bool {
    matches!(arg, lexopt::Arg::Long("help") | lexopt::Arg::Short('h'))
}

/// Set by a signal [`stop_on_signals`] installed for: the long-running subcommands (`monitor`,
/// `top`) leave their loop and clean up.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Make `signals` request a stop ([`stop_requested`]) instead of killing the process. No
/// `SA_RESTART`: a blocking `poll` returns at once with `EINTR`.
pub fn stop_on_signals(signals: &[libc::c_int]) {
    for &sig in signals {
        // SAFETY: an all-zero sigaction is valid and is filled in before use; the handler only
        // stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = request_stop as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Whether a signal installed by [`stop_on_signals`] arrived.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// A command line from its words, for the subcommands' unit tests.
#[cfg(test)]
pub fn test_args(a: &[&str]) -> Vec<OsString> {
    a.iter().map(OsString::from).collect()
}

#[cfg(test)]
mod tests {
    use super::test_args as args;
    use super::*;
    use crate::commands::{STATUS, TOP};

    #[test]
    fn help_ends_the_subcommand_in_order_with_exit_0() {
        for help in ["--help", "-h"] {
            let mut a = Args::new(args(&["--json", help, "--bogus"]), &STATUS);
            assert!(matches!(a.next(), Ok(Some(lexopt::Arg::Long("json")))));
            let f = a.next().unwrap_err();
            assert!(matches!(f, Failure::Helped), "{f:?}");
            assert_eq!(f.report(), 0);
        }
        // What comes before `--help` is read first: a bad flag there is bad usage.
        match json_flag(args(&["--bogus", "--help"]), &STATUS) {
            Err(Failure::Usage { msg, .. }) => assert!(msg.contains("--bogus"), "{msg}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            json_flag(args(&["--help"]), &STATUS),
            Err(Failure::Helped)
        ));
        assert!(json_flag(args(&["--json"]), &STATUS).unwrap());
        assert!(!json_flag(args(&[]), &STATUS).unwrap());
    }

    #[test]
    fn a_value_names_its_flag_and_the_usage() {
        let mut a = Args::new(args(&["--interval"]), &TOP);
        assert!(a.next().unwrap().is_some());
        match a.utf8("--interval") {
            Err(Failure::Usage { usage, .. }) => assert_eq!(usage.name, "top"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_flag_the_definition_does_not_name_is_bad_usage() {
        for bad in ["--yaml", "-x", "--interval"] {
            match json_flag(args(&[bad]), &STATUS) {
                Err(Failure::Usage { msg, usage }) => {
                    assert!(
                        msg.contains(bad) && msg.contains("gpuslice status"),
                        "{msg}"
                    );
                    assert_eq!(usage.name, "status");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
