//! Every subcommand of `gpuslice` and every flag it takes, defined once ([`COMMANDS`]).
//!
//! `gpuslice --help`, each subcommand's `--help`, the usage line under each usage error, and
//! the set of flags each subcommand's parser is handed ([`crate::cli::Args`] refuses any other)
//! all come from these definitions, so what the help says and what the parser takes cannot
//! drift apart; a unit test (below) checks that each parser takes every flag defined for it.

/// One flag of a subcommand.
#[derive(Debug)]
pub struct Flag {
    /// Its long name, without `--`.
    pub name: &'static str,
    /// A one-letter alias (`-o`), if any.
    pub short: Option<char>,
    /// What its value looks like (`Q`, `latency|normal`); empty for a switch.
    pub value: &'static str,
    /// One line (or a few) on what it does.
    pub help: &'static str,
    /// The subcommand cannot run without it (shown without brackets).
    pub required: bool,
    /// Exclusive with the flag after it: shown as `[--a X | --b Y]`.
    pub or_next: bool,
}

/// A flag that takes a value.
const fn flag(name: &'static str, value: &'static str, help: &'static str) -> Flag {
    Flag {
        name,
        short: None,
        value,
        help,
        required: false,
        or_next: false,
    }
}

/// A flag without a value.
const fn switch(name: &'static str, help: &'static str) -> Flag {
    flag(name, "", help)
}

impl Flag {
    const fn required(self) -> Flag {
        Flag {
            required: true,
            ..self
        }
    }

    const fn or_next(self) -> Flag {
        Flag {
            or_next: true,
            ..self
        }
    }

    const fn short(self, c: char) -> Flag {
        Flag {
            short: Some(c),
            ..self
        }
    }

    /// `--memory Q`, `--json`.
    fn form(&self) -> String {
        if self.value.is_empty() {
            format!("--{}", self.name)
        } else {
            format!("--{} {}", self.name, self.value)
        }
    }
}

/// One subcommand.
#[derive(Debug)]
pub struct Command {
    /// Its words after `gpuslice` (`slice create`).
    pub name: &'static str,
    /// Operands before the flags (`NAME`); empty for none.
    pub operands: &'static str,
    /// What follows the flags (`[--] CMD ARGS...`); empty for nothing.
    pub trailing: &'static str,
    /// One line: what it does (in `gpuslice --help` and atop its own `--help`).
    pub summary: &'static str,
    pub flags: &'static [Flag],
    /// More on it, after the flags in its `--help`; empty for nothing.
    pub details: &'static str,
    /// Its own subcommands (`slice`: create, set, rm, ls), whose usage lines are its own.
    pub subcommands: &'static [&'static Command],
}

// Values shared by `run`, `cdi` and `slice create|set`.
const MEMORY: &str = "VRAM quota per device: 4Gi, 4096Mi, 4G, 4GiB, bytes, 25% of the device, \
                      or per device 0=4Gi,1=8Gi";
const COMPUTE: &str = "guaranteed compute share: 0.25 or 25% (lent to others while idle)";
const COMPUTE_CAP: &str = "hard compute ceiling, same syntax (never more, even when idle)";
const PRIORITY: &str = "latency: launches go at once, ahead of normal work; normal (the default)";
const SLICE_MEMORY: &str = "VRAM quota on the device: 4Gi, 4096Mi, 4G, bytes, or 25% of it";
const MEMORY_FLAG: Flag = flag("memory", "Q", MEMORY);
const COMPUTE_FLAG: Flag = flag("compute", "F", COMPUTE);
const CAP_FLAG: Flag = flag("compute-cap", "F", COMPUTE_CAP);
const PRIORITY_FLAG: Flag = flag("priority", "latency|normal", PRIORITY);

pub static RUN: Command = Command {
    name: "run",
    operands: "",
    trailing: "[--] CMD ARGS...",
    summary: "run a program under gpuslice, held to a VRAM quota and a compute share",
    flags: &[
        MEMORY_FLAG,
        COMPUTE_FLAG,
        CAP_FLAG,
        PRIORITY_FLAG,
        flag(
            "slice",
            "NAME",
            "share one quota with every process naming the same slice (default: CMD and every \
             process it starts form one slice, run-<pid>-<random>, removed with its last process)",
        ),
    ],
    details: "\
Flags set GPUSLICE_MEMORY, GPUSLICE_COMPUTE, GPUSLICE_COMPUTE_CAP, GPUSLICE_PRIORITY and
GPUSLICE_SLICE for CMD; variables already in the environment apply when a flag is not given.
Starts the node monitor in the background when none is running.
The library is $GPUSLICE_LIBRARY, else libgpuslice.so beside this binary, else ../lib/.
Exits with CMD's status, or 128+N when signal N killed it.",
    subcommands: &[],
};

pub static MONITOR: Command = Command {
    name: "monitor",
    operands: "",
    trailing: "",
    summary: "run the node monitor in the foreground (reaping, NVML audit, metrics)",
    flags: &[
        flag(
            "metrics-listen",
            "ADDR",
            "serve Prometheus metrics at http://ADDR/metrics (127.0.0.1:9400; port 0 picks one)",
        ),
        flag(
            "interval",
            "MS",
            "reap every MS milliseconds, 10 to 5000 (default 250)",
        ),
        flag(
            "mode",
            "node|personal",
            "node: tenants are other users, admitted over monitor.sock (default for root on \
             the default directory); personal: one user's own programs",
        ),
        flag(
            "on-violation",
            "report|kill",
            "a slice NVML finds over its quota is reported, or its processes that are over \
             killed, and tenants' bypasses (default: kill in node mode, report in personal mode)",
        ),
        flag(
            "context-allowance",
            "SIZE",
            "device memory the audit allows each process beyond its quota for its CUDA \
             context, which NVML counts and quotas do not (default 512Mi)",
        ),
        flag(
            "context-memory",
            "SIZE",
            "node mode: what each CUDA context is charged to its slice, inside the quota as on a \
             GPU (default: what the monitor's own context takes on the device)",
        ),
        flag(
            "balloons",
            "on|off",
            "node mode: hold every slice's unused reservation on the GPU, so no program can \
             take it (default on)",
        ),
        flag(
            "max-procs-per-user",
            "N",
            "node mode: processes one user may have attached (default 256)",
        ),
        flag(
            "max-slices-per-user",
            "N",
            "node mode: slices one user may make (default 4096)",
        ),
        flag(
            "operator-group",
            "NAME",
            "node mode: the group whose members may run `gpuslice slice` (default gpuslice)",
        ),
    ],
    details: "",
    subcommands: &[],
};

pub static STATUS: Command = Command {
    name: "status",
    operands: "",
    trailing: "",
    summary: "devices, slices and processes on this node, once",
    flags: &[switch(
        "json",
        "one JSON object (sizes in bytes, fractions 0..1) instead of tables",
    )],
    details: "\
COMPUTE USED is the slice's share of the device's time over the scheduler's last window:
the slices of one device never sum past 100%.",
    subcommands: &[],
};

pub static TOP: Command = Command {
    name: "top",
    operands: "",
    trailing: "",
    summary: "the same, refreshed live in the terminal (q quits)",
    flags: &[flag(
        "interval",
        "MS",
        "refresh every MS milliseconds, 100 to 60000 (default 1000)",
    )],
    details: "",
    subcommands: &[],
};

pub static SLICE_CREATE: Command = Command {
    name: "slice create",
    operands: "NAME",
    trailing: "",
    summary: "define a slice ahead of the programs that join it",
    flags: &[
        flag("memory", "Q", SLICE_MEMORY).required(),
        COMPUTE_FLAG,
        CAP_FLAG,
        PRIORITY_FLAG,
        flag(
            "device",
            "I|UUID",
            "NVML's index of the device (default 0), or its UUID",
        ),
        flag(
            "owner",
            "UID|USER",
            "node mode: only this user's processes may join the slice",
        ),
        flag(
            "secret-file",
            "PATH",
            "node mode: joining needs the secret in PATH (an existing file, mode 0600)",
        )
        .or_next(),
        flag(
            "new-secret-file",
            "PATH",
            "node mode: make a random join secret and write it to PATH (a new file)",
        ),
    ],
    details: "Admission: a device's quotas never sum past its memory, nor its shares past 1.",
    subcommands: &[],
};

pub static SLICE_SET: Command = Command {
    name: "slice set",
    operands: "NAME",
    trailing: "",
    summary: "change a slice live, on every device it is on",
    flags: &[
        flag(
            "memory",
            "Q",
            "VRAM quota, in bytes (4Gi, 4096Mi, 4G, bytes)",
        ),
        COMPUTE_FLAG,
        CAP_FLAG,
        PRIORITY_FLAG,
    ],
    details: "Running processes see the change at their next allocation or compute turn.",
    subcommands: &[],
};

pub static SLICE_RM: Command = Command {
    name: "slice rm",
    operands: "NAME",
    trailing: "",
    summary: "remove a slice an operator defined (one in use goes with its last process)",
    flags: &[],
    details: "",
    subcommands: &[],
};

pub static SLICE_LS: Command = Command {
    name: "slice ls",
    operands: "",
    trailing: "",
    summary: "the slices operators defined",
    flags: &[switch("json", "one JSON object instead of a table")],
    details: "",
    subcommands: &[],
};

pub static METRICS: Command = Command {
    name: "metrics",
    operands: "",
    trailing: "",
    summary: "the Prometheus text exposition, once, on stdout",
    flags: &[],
    details: "",
    subcommands: &[],
};

pub static CDI: Command = Command {
    name: "cdi",
    operands: "",
    trailing: "",
    summary: "a Container Device Interface spec that puts a container in a slice",
    flags: &[
        flag(
            "slice",
            "NAME",
            "the slice, and the CDI device name (letters, digits, _ - . :)",
        )
        .required(),
        MEMORY_FLAG,
        COMPUTE_FLAG,
        CAP_FLAG,
        PRIORITY_FLAG,
        flag(
            "secret-file",
            "PATH",
            "the slice's join secret (`slice create --secret-file`); the spec is then mode 0600",
        ),
        flag(
            "kind",
            "VENDOR/CLASS",
            "the CDI kind (default gpuslice.dev/slice)",
        ),
        flag(
            "library",
            "PATH",
            "the host's libgpuslice.so (default: found as `gpuslice run` finds it)",
        ),
        flag(
            "output",
            "FILE",
            "write FILE (atomically) instead of stdout, and beside it (FILE less its \
             extension, .d/) the /etc/ld.so.preload and settings file it mounts",
        )
        .short('o'),
    ],
    details: "\
The host's ledger directory ($GPUSLICE_RUNTIME_DIR, default /dev/shm/gpuslice) is mounted at
/run/gpuslice. With --output, the container's /etc/ld.so.preload names the library and
/etc/gpuslice/slice.env holds the spec's variables, so programs that clear their environment
are in the slice too. Put the spec in /etc/cdi/ and use it beside the GPU's own CDI device:
  --device nvidia.com/gpu=0 --device gpuslice.dev/slice=NAME",
    subcommands: &[],
};

pub static VERSION: Command = Command {
    name: "version",
    operands: "",
    trailing: "",
    summary: "the version of this build",
    flags: &[],
    details: "",
    subcommands: &[],
};

/// `gpuslice slice` alone: its subcommands' usage lines.
pub static SLICE: Command = Command {
    name: "slice",
    operands: "create|set|rm|ls",
    trailing: "...",
    summary: "operator-defined slices: create, set, rm, ls",
    flags: &[],
    details: "",
    subcommands: &[&SLICE_CREATE, &SLICE_SET, &SLICE_RM, &SLICE_LS],
};

/// Every subcommand, in the order `gpuslice --help` lists them.
pub static COMMANDS: [&Command; 11] = [
    &RUN,
    &STATUS,
    &TOP,
    &MONITOR,
    &SLICE_CREATE,
    &SLICE_SET,
    &SLICE_RM,
    &SLICE_LS,
    &METRICS,
    &CDI,
    &VERSION,
];

/// Lines are wrapped before this many columns.
const WIDTH: usize = 96;

/// `words` joined by spaces into lines of at most [`WIDTH`] columns, the first starting with
/// `first`, the others with `indent` (a word longer than a line gets a line of its own).
fn wrap(first: &str, indent: &str, words: impl IntoIterator<Item = String>) -> String {
    let mut out = String::from(first);
    let mut line = first.chars().count();
    // No space after a first part that ends in one (or is empty).
    let mut fresh = first.is_empty() || first.ends_with(' ');
    for w in words {
        let n = w.chars().count();
        if !fresh && line + 1 + n > WIDTH {
            out.push('\n');
            out.push_str(indent);
            line = indent.chars().count();
            fresh = true;
        }
        if !fresh {
            out.push(' ');
            line += 1;
        }
        out.push_str(&w);
        line += n;
        fresh = false;
    }
    out
}

impl Command {
    /// The synopsis's words: `slice create NAME --memory Q [--compute F] ...`, one word per
    /// flag (brackets included) so that wrapping never splits a flag from its value.
    fn words(&self) -> Vec<String> {
        let mut w: Vec<String> = self.name.split(' ').map(String::from).collect();
        if !self.operands.is_empty() {
            w.push(self.operands.into());
        }
        let mut i = 0;
        while i < self.flags.len() {
            let f = &self.flags[i];
            if f.or_next && i + 1 < self.flags.len() {
                w.push(format!("[{} | {}]", f.form(), self.flags[i + 1].form()));
                i += 2;
                continue;
            }
            w.push(if f.required {
                f.form()
            } else {
                format!("[{}]", f.form())
            });
            i += 1;
        }
        if !self.trailing.is_empty() {
            w.push(self.trailing.into());
        }
        w
    }

    /// `usage: gpuslice slice create NAME --memory Q [--compute F] ...`, wrapped: the line
    /// under a usage error and atop `--help`.
    pub fn usage(&self) -> String {
        if self.subcommands.is_empty() {
            return wrap("usage: gpuslice", "         ", self.words());
        }
        let lines: Vec<String> = self
            .subcommands
            .iter()
            .map(|c| c.usage()[7..].to_string())
            .collect();
        format!("usage: {}", lines.join("\n       "))
    }

    /// What `gpuslice CMD --help` prints: the usage, the summary, each flag, the details.
    pub fn help(&self) -> String {
        if !self.subcommands.is_empty() {
            let mut out = self.usage();
            for c in self.subcommands {
                out.push_str(&format!("\n\n  gpuslice {}: {}", c.name, c.summary));
            }
            out.push_str(&format!(
                "\n\n`gpuslice {} SUBCOMMAND --help` says what each flag takes.",
                self.name
            ));
            return out;
        }
        let mut out = format!("{}\n\n{}", self.usage(), capitalised(self.summary));
        if !self.flags.is_empty() {
            out.push('\n');
            let width = self
                .flags
                .iter()
                .map(|f| f.form().len() + f.short.map_or(0, |_| 4))
                .max()
                .unwrap_or(0);
            for f in self.flags {
                let form = match f.short {
                    Some(c) => format!("-{c}, {}", f.form()),
                    None => f.form(),
                };
                let first = format!("\n  {form:<width$}  ");
                let indent = " ".repeat(width + 4);
                out.push_str(&wrap(
                    &first,
                    &indent,
                    f.help.split_whitespace().map(String::from),
                ));
            }
        }
        if !self.details.is_empty() {
            out.push_str("\n\n");
            out.push_str(self.details);
        }
        out
    }

    /// The flag `--name` (or `-c`), if this subcommand takes it.
    pub fn flag(&'static self, arg: &lexopt::Arg<'_>) -> Option<&'static Flag> {
        match arg {
            lexopt::Arg::Long(name) => self.flags.iter().find(|f| f.name == *name),
            lexopt::Arg::Short(c) => self.flags.iter().find(|f| f.short == Some(*c)),
            lexopt::Arg::Value(_) => None,
        }
    }
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => format!("{}{}.", f.to_uppercase(), c.as_str()),
        None => String::new(),
    }
}

/// What `gpuslice --help` (and a missing or unknown command) prints: every subcommand's usage
/// with its summary.
pub fn overview() -> String {
    let mut out = String::from("usage: gpuslice <command> [options]\n\ncommands:");
    for c in COMMANDS {
        out.push('\n');
        out.push_str(&wrap("  gpuslice", "      ", c.words()));
        out.push_str("\n      ");
        out.push_str(c.summary);
    }
    out.push_str(
        "\n\n`gpuslice COMMAND --help` says what each flag takes.\n\
         The ledger lives in $GPUSLICE_RUNTIME_DIR (default /dev/shm/gpuslice).",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overview_names_every_subcommand_and_flag() {
        let text = overview();
        for c in COMMANDS {
            assert!(text.contains(&format!("gpuslice {}", c.name)), "{}", c.name);
            for f in c.flags {
                assert!(text.contains(&f.form()), "{} {}", c.name, f.form());
            }
        }
        for want in [
            "slice set",
            "--priority",
            "--owner",
            "--secret-file",
            "--new-secret-file",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH), "{text}");
    }

    #[test]
    fn usage_lines_keep_each_flag_with_its_value_and_stay_narrow() {
        let u = SLICE_CREATE.usage();
        assert!(u.starts_with("usage: gpuslice slice create NAME --memory Q [--compute F]"));
        assert!(
            u.contains("[--secret-file PATH | --new-secret-file PATH]"),
            "{u}"
        );
        assert!(
            u.lines().count() > 1 && u.lines().all(|l| l.len() <= WIDTH),
            "{u}"
        );
        assert_eq!(STATUS.usage(), "usage: gpuslice status [--json]");
        assert!(RUN.usage().ends_with("[--slice NAME] [--] CMD ARGS..."));
        let h = CDI.help();
        assert!(h.contains("\n  -o, --output FILE "), "{h}");
        assert!(h.contains("  --priority latency|normal"), "{h}");
    }
}
