//! Every subcommand's definition ([`crate::commands`]) against its parser: the help cannot
//! promise a flag the parser refuses, and `Args` refuses any flag the help does not name. A
//! test of its own, above every subcommand's module, so no module imports back up.

use crate::cli::Failure;
use crate::commands::{Command, COMMANDS};

/// A value of the form a flag's placeholder names, that its parser accepts.
fn sample(value: &str) -> &str {
    match value {
        "Q" => "1Gi",
        "SIZE" => "512Mi",
        "F" => "0.5",
        "NAME" => "s1",
        "MS" => "500",
        "N" => "1",
        "ADDR" => "127.0.0.1:0",
        "I|UUID" | "UID|USER" => "0",
        "PATH" | "FILE" => "/nonexistent/x",
        "VENDOR/CLASS" => "example.com/slice",
        alternatives => alternatives.split('|').next().unwrap(),
    }
}

/// Run the parser of `c` (only the parser: nothing is created, started or written).
fn parse(c: &'static Command, mut args: Vec<std::ffi::OsString>) -> Result<(), Failure> {
    match c.name {
        "run" => crate::run::parse(args).map(drop),
        "cdi" => crate::cdi::parse(args).map(drop),
        "monitor" => crate::daemon::parse_options(args),
        "top" => crate::top::parse(args).map(drop),
        "slice create" => {
            crate::slice::take_priority(&mut args)?;
            crate::slice::parse_create(args).map(drop)
        }
        "slice set" => crate::slice::parse_set(args).map(drop),
        // No flags, or `--json` alone (`json_flag`, as status and slice ls parse it).
        _ => crate::cli::json_flag(args, c).map(drop),
    }
}

/// Every flag a subcommand's definition names is one its parser takes: the help cannot
/// promise a flag the parser refuses (and `Args` refuses any flag the help does not name).
#[test]
fn every_defined_flag_is_one_its_parser_takes() {
    let mut checked = 0;
    for c in COMMANDS {
        for f in c.flags {
            let mut words: Vec<String> = Vec::new();
            if !c.operands.is_empty() {
                words.push("s1".into());
            }
            for r in c.flags.iter().filter(|r| r.required && r.name != f.name) {
                words.extend([format!("--{}", r.name), sample(r.value).into()]);
            }
            words.push(format!("--{}", f.name));
            if !f.value.is_empty() {
                words.push(sample(f.value).into());
            }
            if !c.trailing.is_empty() {
                words.push("true".into());
            }
            let args = words.iter().map(std::ffi::OsString::from).collect();
            if let Err(e) = parse(c, args) {
                panic!("gpuslice {} {}: {e:?}", c.name, words.join(" "));
            }
            checked += 1;
        }
        // And one it does not name is refused, naming it.
        let mut words = vec!["--no-such-flag".to_string()];
        if !c.trailing.is_empty() {
            words.push("true".into());
        }
        match parse(c, words.iter().map(std::ffi::OsString::from).collect()) {
            Err(Failure::Usage { msg, .. }) => assert!(msg.contains("--no-such-flag"), "{msg}"),
            other => panic!("gpuslice {} --no-such-flag: {other:?}", c.name),
        }
    }
    assert!(checked >= 30, "{checked}");
}
