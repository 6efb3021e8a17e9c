//! `gpuslice top`: `status`'s tables, refreshed in place in a terminal until `q`.
//!
//! The terminal is put in raw mode (termios, no echo, no line buffering) on the alternate
//! screen with the cursor hidden; [`Terminal`]'s `Drop`, a panic hook and the SIGINT/SIGTERM/
//! SIGHUP handlers all lead to the same restore, so the shell is usable afterwards whatever
//! happens. Frames never clear the screen: each one homes the cursor and overwrites lines,
//! erasing only what is left to the right of each and below the last, so nothing flickers.

use crate::cli::{self, Failure};
use std::ffi::OsString;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const USAGE: &cli::Command = &crate::commands::TOP;

/// The terminal settings to restore (taken before raw mode).
static SAVED: Mutex<Option<libc::termios>> = Mutex::new(None);

/// Alternate screen on, cursor hidden / back.
const ENTER: &str = "\x1b[?1049h\x1b[?25l";
const LEAVE: &str = "\x1b[?25h\x1b[?1049l";

/// Put the terminal back as we found it. Safe to call more than once.
fn restore() {
    let saved = SAVED.lock().map(|mut s| s.take()).unwrap_or(None);
    if let Some(t) = saved {
        // SAFETY: restoring settings read from the same descriptor by tcgetattr.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSAFLUSH, &t) };
        let mut out = std::io::stdout();
        let _ = out.write_all(LEAVE.as_bytes());
        let _ = out.flush();
    }
}

/// The terminal in raw mode on the alternate screen, restored on drop.
struct Terminal;

impl Terminal {
    fn enter() -> Result<Terminal, Failure> {
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(libc::STDIN_FILENO) } != 1
            // SAFETY: as above.
            || unsafe { libc::isatty(libc::STDOUT_FILENO) } != 1
        {
            return Err(Failure::Other(
                "top needs a terminal on stdin and stdout; for a one-shot view use `gpuslice status`".into(),
            ));
        }
        // SAFETY: termios is plain data; tcgetattr fills it for a terminal descriptor.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `t` is a valid out-pointer.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut t) } != 0 {
            return Err(Failure::Other(format!(
                "cannot read the terminal's settings: {}",
                std::io::Error::last_os_error()
            )));
        }
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            prev(info);
        }));
        // poll() returns at once on these, and the loop restores the terminal.
        cli::stop_on_signals(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]);
        let mut raw = t;
        // Keystrokes one by one, no echo; ISIG stays on so ^C still stops us (through STOP).
        raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::IEXTEN);
        raw.c_iflag &= !(libc::IXON | libc::ICRNL);
        raw.c_cc[libc::VMIN] = 0;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: applying a modified copy of the settings just read.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSAFLUSH, &raw) };
        let mut out = std::io::stdout();
        let _ = out.write_all(ENTER.as_bytes());
        let _ = out.flush();
        Ok(Terminal)
    }

    /// (columns, rows), with a sane fallback.
    fn size(&self) -> (usize, usize) {
        // SAFETY: winsize is plain data and TIOCGWINSZ fills it.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: `ws` is a valid out-pointer for this request.
        let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
        if ok && ws.ws_col > 0 && ws.ws_row > 0 {
            (ws.ws_col as usize, ws.ws_row as usize)
        } else {
            (80, 24)
        }
    }

    /// Wait up to `timeout` for a key; `Some(byte)` when one came.
    fn key(&self, timeout: Duration) -> Option<u8> {
        let mut fd = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) };
        if n <= 0 {
            return None;
        }
        let mut b = [0u8; 1];
        // SAFETY: reading one byte into a one-byte buffer.
        let r = unsafe { libc::read(libc::STDIN_FILENO, b.as_mut_ptr().cast(), 1) };
        if r == 1 {
            Some(b[0])
        } else if r == 0 {
            Some(b'q') // the terminal went away: leave
        } else {
            None
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        restore();
    }
}

/// Cut a line to `width` columns (characters; the tables are ASCII but names may not be).
fn fit(line: &str, width: usize) -> &str {
    match line.char_indices().nth(width) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

/// One frame: home, each line overwritten and cleared to its end, the rest of the screen erased.
fn frame(lines: &[String], cols: usize, rows: usize) -> String {
    let mut s = String::from("\x1b[H");
    for (i, l) in lines.iter().take(rows).enumerate() {
        if i > 0 {
            s.push_str("\r\n");
        }
        s.push_str(fit(l, cols));
        s.push_str("\x1b[K");
    }
    s.push_str("\x1b[J");
    s
}

/// Parse `gpuslice top`'s arguments: the refresh interval.
pub(crate) fn parse(args: Vec<OsString>) -> Result<Duration, Failure> {
    let mut interval: Option<Duration> = None;
    let mut args = cli::Args::new(args, USAGE);
    while let Some(arg) = args.next()? {
        match arg {
            lexopt::Arg::Long("interval") => {
                let v = args.utf8("--interval")?;
                cli::millis(&mut interval, "--interval", &v, 100..=60_000, USAGE)?;
            }
            _ => return Err(Failure::usage(arg.unexpected().to_string(), USAGE)),
        }
    }
    Ok(interval.unwrap_or(Duration::from_secs(1)))
}

/// Entry point of `gpuslice top`.
pub fn main(args: Vec<OsString>) -> i32 {
    cli::exit_status((|| {
        let interval = parse(args)?;
        let dir = cli::runtime_dir();
        let term = Terminal::enter()?;
        let mut out = std::io::stdout();
        let mut next = Instant::now();
        let mut drawn_size = (0, 0);
        while !cli::stop_requested() {
            // Redraw on schedule, and at once when the window was resized.
            if Instant::now() >= next || term.size() != drawn_size {
                next = Instant::now() + interval;
                let (cols, rows) = term.size();
                drawn_size = (cols, rows);
                let mut lines = vec![
                    format!("{} · {}", crate::status::header(&dir), clock()),
                    "q: quit".to_string(),
                    String::new(),
                ];
                match crate::status::load(&dir) {
                    Ok(snap) => lines.extend(crate::table::render(&snap)),
                    Err(f) => lines.push(format!("error: {}", f.message())),
                }
                let _ = out.write_all(frame(&lines, cols, rows).as_bytes());
                let _ = out.flush();
            }
            let wait = next
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            if let Some(b'q' | b'Q' | 3) = term.key(wait) {
                break;
            }
        }
        drop(term);
        Ok(())
    })())
}

/// `HH:MM:SS` UTC.
fn clock() -> String {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02} UTC",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_overwrite_in_place() {
        let f = frame(&["abcdef".into(), "é-long".into(), "gone".into()], 3, 2);
        assert_eq!(f, "\x1b[Habc\x1b[K\r\né-l\x1b[K\x1b[J");
        assert!(!f.contains("\x1b[2J"), "no full clears");
    }
}
