//! The settings file: a container's `GPUSLICE_*` variables as a read-only file, for the
//! processes that do not inherit the container's environment (`env -i`, daemons, sudo-like
//! wrappers), which `/etc/ld.so.preload` still puts under the shim. The CDI spec of a slice
//! (`gpuslice cdi`, `gpuslice-dra`) writes it on the host and mounts it at [`CONTAINER_PATH`];
//! the shim reads it at start-up for each variable its environment lacks.
//!
//! The format is the one [`render`] writes and [`parse`] reads: one `KEY=VALUE` a line, `KEY`
//! one of [`VARIABLES`] and at most once, the value up to the end of the line as the
//! environment would hold it (no quotes, no escapes); blank lines and lines starting with `#`
//! are ignored. What a value means and accepts is the variable's own rule, checked where the
//! variable is read.

use std::fmt;

/// Where the file appears inside a container (and where the shim looks for it).
pub const CONTAINER_PATH: &str = "/etc/gpuslice/slice.env";

/// The variables the file may set: those a slice's CDI spec sets, less `LD_PRELOAD` (which
/// `/etc/ld.so.preload` stands in for). `GPUSLICE_LOG` and `GPUSLICE_DISABLE` are read
/// before start-up, without reading files, so they are environment-only.
pub const VARIABLES: [&str; 7] = [
    "GPUSLICE_RUNTIME_DIR",
    "GPUSLICE_SLICE",
    "GPUSLICE_SLICE_SECRET",
    "GPUSLICE_MEMORY",
    "GPUSLICE_COMPUTE",
    "GPUSLICE_COMPUTE_CAP",
    "GPUSLICE_PRIORITY",
];

/// Longest file read (bytes): a few lines are expected; anything longer is not this file.
pub const MAX_LEN: usize = 16 * 1024;

/// What the file accepts, for error messages.
pub const FORMS: &str = "lines KEY=VALUE with KEY one of GPUSLICE_RUNTIME_DIR, GPUSLICE_SLICE, \
     GPUSLICE_SLICE_SECRET, GPUSLICE_MEMORY, GPUSLICE_COMPUTE, GPUSLICE_COMPUTE_CAP, \
     GPUSLICE_PRIORITY (each at most once), blank lines and # comments";

/// A line of the file that is not in its format. Never shows a value (a line may hold most of
/// a join secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsFileError {
    /// The file, as the reader names it.
    pub file: String,
    /// The line (from 1); 0 for the file as a whole.
    pub line: usize,
    /// What is wrong with it.
    pub why: String,
}

impl fmt::Display for SettingsFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}; accepted: {FORMS}", self.file, self.why)
        } else {
            write!(
                f,
                "{} line {}: {}; accepted: {FORMS}",
                self.file, self.line, self.why
            )
        }
    }
}

impl std::error::Error for SettingsFileError {}

/// The `(KEY, VALUE)` pairs of `text`, the contents of `file` (named in errors), each with its
/// line number, in file order.
pub fn parse<'a>(
    file: &str,
    text: &'a [u8],
) -> Result<Vec<(&'static str, &'a str, usize)>, SettingsFileError> {
    let err = |line: usize, why: String| SettingsFileError {
        file: file.to_string(),
        line,
        why,
    };
    if text.len() > MAX_LEN {
        return Err(err(
            0,
            format!("{} bytes, longer than {MAX_LEN}", text.len()),
        ));
    }
    let text = std::str::from_utf8(text).map_err(|e| {
        let line = 1 + text[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        err(line, "not UTF-8".into())
    })?;
    let mut out: Vec<(&'static str, &'a str, usize)> = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        let n = i + 1;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(err(n, "not KEY=VALUE".into()));
        };
        let Some(known) = VARIABLES.iter().find(|v| **v == key) else {
            let shown: String = key.chars().take(64).collect();
            return Err(err(
                n,
                format!("{shown:?} is not a variable this file sets"),
            ));
        };
        if let Some((_, _, first)) = out.iter().find(|(k, _, _)| k == known) {
            return Err(err(n, format!("{key} again (first on line {first})")));
        }
        if value.contains(|c: char| c.is_control()) {
            return Err(err(
                n,
                format!("the value of {key} has a control character"),
            ));
        }
        out.push((known, value, n));
    }
    Ok(out)
}

/// The file for `vars` (`KEY`, `VALUE`), with a header saying what it is. Variables not in
/// [`VARIABLES`] (`LD_PRELOAD`) are left out; a value the format cannot hold (a control
/// character: none of the variables' rules accept one) is an error naming the variable.
pub fn render(vars: &[(String, String)]) -> Result<String, String> {
    let mut s = String::from(
        "# gpuslice: the slice settings of this container's processes, read by libgpuslice.so\n\
         # for each variable a process's environment lacks (the environment wins).\n",
    );
    for (k, v) in vars.iter().filter(|(k, _)| VARIABLES.contains(&k.as_str())) {
        if v.contains(|c: char| c.is_control()) {
            return Err(format!("{k}: a value with a control character"));
        }
        s.push_str(k);
        s.push('=');
        s.push_str(v);
        s.push('\n');
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_render_writes_parse_reads() {
        let vars: Vec<(String, String)> = [
            ("LD_PRELOAD", "/usr/lib/gpuslice/libgpuslice.so"),
            ("GPUSLICE_RUNTIME_DIR", "/run/gpuslice"),
            ("GPUSLICE_SLICE", "k8s-3a3a"),
            ("GPUSLICE_SLICE_SECRET", "x=y#z"),
            ("GPUSLICE_MEMORY", "4Gi"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec();
        let text = render(&vars).unwrap();
        assert!(!text.contains("LD_PRELOAD"), "{text}");
        let got = parse("f", text.as_bytes()).unwrap();
        let pairs: Vec<(&str, &str)> = got.iter().map(|(k, v, _)| (*k, *v)).collect();
        assert_eq!(
            pairs,
            [
                ("GPUSLICE_RUNTIME_DIR", "/run/gpuslice"),
                ("GPUSLICE_SLICE", "k8s-3a3a"),
                ("GPUSLICE_SLICE_SECRET", "x=y#z"),
                ("GPUSLICE_MEMORY", "4Gi"),
            ]
        );
        assert_eq!(got[0].2, 3, "after the two header lines");
        assert!(render(&[("GPUSLICE_SLICE".into(), "a\nGPUSLICE_MEMORY=1".into())]).is_err());
    }

    #[test]
    fn blank_lines_comments_and_values_as_the_environment_holds_them() {
        let got = parse(
            "f",
            b"\n# a comment\n   \nGPUSLICE_SLICE= a b \nGPUSLICE_MEMORY=\n",
        )
        .unwrap();
        assert_eq!(
            got,
            [("GPUSLICE_SLICE", " a b ", 4), ("GPUSLICE_MEMORY", "", 5)]
        );
        assert_eq!(parse("f", b"").unwrap(), []);
    }

    #[test]
    fn a_malformed_line_is_named_with_what_is_accepted_never_its_value() {
        let secret = "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4";
        for (text, line, why) in [
            ("GPUSLICE_SLICE=a\nnonsense\n", 2, "not KEY=VALUE"),
            ("LD_PRELOAD=/x.so\n", 1, "\"LD_PRELOAD\" is not a variable"),
            ("GPUSLICE_LOG=debug\n", 1, "\"GPUSLICE_LOG\" is not"),
            (" GPUSLICE_SLICE=a\n", 1, "\" GPUSLICE_SLICE\" is not"),
            ("export GPUSLICE_SLICE=a\n", 1, "is not a variable"),
            (
                "GPUSLICE_SLICE=a\n\nGPUSLICE_SLICE=b\n",
                3,
                "again (first on line 1)",
            ),
            ("GPUSLICE_SLICE=a\r\n", 1, "control character"),
        ] {
            let e = parse("/etc/gpuslice/slice.env", text.as_bytes()).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            let s = e.to_string();
            assert!(
                s.starts_with(&format!("/etc/gpuslice/slice.env line {line}: "))
                    && s.contains(why)
                    && s.contains("accepted: lines KEY=VALUE with KEY one of GPUSLICE_RUNTIME_DIR"),
                "{text:?}: {s}"
            );
        }
        let e = parse(
            "f",
            format!("GPUSLICE_SLICE_SECRET={secret}\x01\n").as_bytes(),
        )
        .unwrap_err()
        .to_string();
        assert!(!e.contains(secret), "{e}");
        let e = parse("f", b"GPUSLICE_SLICE=a\n\xff\n").unwrap_err();
        assert_eq!((e.line, e.why.as_str()), (2, "not UTF-8"));
        let e = parse("f", &vec![b'#'; MAX_LEN + 1]).unwrap_err();
        assert_eq!(e.line, 0);
        assert!(
            e.to_string()
                .starts_with("f: 16385 bytes, longer than 16384"),
            "{e}"
        );
    }
}
