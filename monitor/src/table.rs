//! The human view of a [`NodeView`]: aligned tables with sizes in GiB/MiB and fractions as
//! percentages, as `nvidia-smi` and `nvtop` users read them. `status` prints these lines once;
//! `top` redraws them in place.

use crate::view::NodeView;

/// A size for people (`16 GiB`, `1.50 GiB`, `512 MiB`): the ledger's one rendering, so
/// admission errors and tables read alike.
pub fn size(bytes: u64) -> String {
    gpuslice_ledger::human_bytes(bytes)
}

/// A fraction 0..1 as a percentage: `25%`, `12.5%`.
pub fn percent(f: f64) -> String {
    let p = f * 100.0;
    if (p - p.round()).abs() < 0.05 {
        format!("{:.0}%", p)
    } else {
        format!("{:.1}%", p)
    }
}

/// `used / total (pct)`: one memory cell.
fn usage(used: u64, total: u64) -> String {
    let pct = if total == 0 {
        0.0
    } else {
        used as f64 / total as f64
    };
    format!("{} / {} ({})", size(used), size(total), percent(pct))
}

/// `text` as it may be shown on a terminal: control characters (C0, DEL, C1: the escape
/// sequences a terminal would act on), Unicode format characters that reorder or hide text
/// (bidirectional overrides, zero-width characters), and the backslash itself are written as
/// `\u{..}` / `\\` escapes, so a name planted in the ledger can neither drive the terminal nor
/// pass for another name. Names gpuslice itself accepts never contain any of these; `--json`
/// output stays exact (JSON escapes on its own terms).
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c == '\\'
            || c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}' | '\u{feff}')
    }
    if !text.chars().any(unsafe_char) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.into()
}

/// Column alignment.
#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// Lay out rows under headers, columns separated by two spaces, trailing spaces trimmed; with
/// no rows, the headers and the line `none`.
fn layout(headers: &[(&str, Align)], rows: &[Vec<String>], none: &str) -> Vec<String> {
    // Every cell may hold text from the ledger (names, UUIDs): escape it before measuring.
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| terminal_safe(c).into_owned()).collect())
        .collect();
    let mut width: Vec<usize> = headers.iter().map(|(h, _)| h.chars().count()).collect();
    for r in &rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = width[i].saturating_sub(cell.chars().count());
            if i > 0 {
                out.push_str("  ");
            }
            match headers[i].1 {
                Align::Left => {
                    out.push_str(cell);
                    out.extend(std::iter::repeat_n(' ', pad));
                }
                Align::Right => {
                    out.extend(std::iter::repeat_n(' ', pad));
                    out.push_str(cell);
                }
            }
        }
        out.trim_end().to_string()
    };
    let mut out = vec![line(headers.iter().map(|(h, _)| *h).collect())];
    for r in &rows {
        out.push(line(r.iter().map(String::as_str).collect()));
    }
    if rows.is_empty() {
        out.push(none.into());
    }
    out
}

/// The device index of a slice's device, or `?` when the device is unknown.
fn device_index(snap: &NodeView, uuid: &str) -> String {
    snap.device(uuid)
        .map_or("?".into(), |d| d.index.to_string())
}

/// What the compute columns mean, under the slice table: a newcomer reads them without the
/// docs.
const LEGEND: [&str; 4] = [
    "COMPUTE SHARE: guaranteed under contention, lent out while idle; CAP: never more.",
    "COMPUTE USED: its part of the GPU's busy time over the last second (a GPU's slices never \
     sum past 100%).",
    "MEMORY USED / QUOTA: what its processes hold, of what they may (best effort: no quota).",
    "OF IT CONTEXTS: what their CUDA contexts are charged, inside the quota as on a GPU (node \
     mode; the rest is allocations).",
];

/// `COMPUTE USED (1 s)`: the column, with the scheduler's window.
fn compute_used_header() -> String {
    let ms = gpuslice_sched::WINDOW_NS / 1_000_000;
    if ms.is_multiple_of(1000) {
        format!("COMPUTE USED ({} s)", ms / 1000)
    } else {
        format!("COMPUTE USED ({ms} ms)")
    }
}

/// The three tables (devices, slices, processes) as lines, without a trailing newline.
pub fn render(snap: &NodeView) -> Vec<String> {
    use Align::*;
    let mut out = Vec::new();
    let devices: Vec<Vec<String>> = snap
        .devices
        .iter()
        .map(|d| {
            vec![
                d.index.to_string(),
                d.name.clone(),
                d.uuid.clone(),
                usage(d.memory_used, d.memory_total),
                size(d.memory_reserved),
                percent(d.compute_reserved),
            ]
        })
        .collect();
    out.extend(layout(
        &[
            ("GPU", Right),
            ("NAME", Left),
            ("UUID", Left),
            ("MEMORY USED / TOTAL", Right),
            ("MEMORY PROMISED", Right),
            ("COMPUTE PROMISED", Right),
        ],
        &devices,
        "(no devices: NVML lists none (is libnvidia-ml.so.1 on the library path?) and no \
         process has used one)",
    ));
    out.push(String::new());

    let slices: Vec<Vec<String>> = snap
        .slices
        .iter()
        .map(|s| {
            let pids = if s.pids.is_empty() {
                "-".to_string()
            } else {
                s.pids
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            vec![
                s.name.clone(),
                device_index(snap, &s.device_uuid),
                match s.memory_limit {
                    Some(l) => usage(s.memory_used, l),
                    None => format!("{} / best effort", size(s.memory_used)),
                },
                if s.memory_contexts > 0 {
                    size(s.memory_contexts)
                } else {
                    "-".into()
                },
                if s.compute_share > 0.0 {
                    percent(s.compute_share)
                } else {
                    "best effort".into()
                },
                if s.compute_cap < 1.0 {
                    percent(s.compute_cap)
                } else {
                    "-".into()
                },
                percent(s.compute_used),
                if s.operator { "operator" } else { "process" }.into(),
                s.owner.map_or("any".into(), |u| format!("uid {u}")),
                pids,
            ]
        })
        .collect();
    let used = compute_used_header();
    out.extend(layout(
        &[
            ("SLICE", Left),
            ("GPU", Right),
            ("MEMORY USED / QUOTA", Right),
            ("OF IT CONTEXTS", Right),
            ("COMPUTE SHARE", Right),
            ("CAP", Right),
            (used.as_str(), Right),
            ("DEFINED BY", Left),
            ("OWNER", Left),
            ("PIDS", Left),
        ],
        &slices,
        "(no slices)",
    ));
    if !snap.slices.is_empty() {
        out.extend(LEGEND.iter().map(|l| l.to_string()));
    }
    out.push(String::new());

    let procs: Vec<Vec<String>> = snap
        .processes
        .iter()
        .map(|p| vec![p.pid.to_string(), p.slice.clone(), size(p.memory_used)])
        .collect();
    // Only running processes are listed ([`crate::ledger_window::LedgerWindow::snapshot`]).
    out.extend(layout(
        &[("PID", Right), ("SLICE", Left), ("MEMORY", Right)],
        &procs,
        "(no processes)",
    ));
    // Exported memory no process of its slice holds any more (node mode: kept charged for the
    // importers or descriptors that do); listed only when there is some.
    if !snap.orphans.is_empty() {
        out.push(String::new());
        let rows: Vec<Vec<String>> = snap
            .orphans
            .iter()
            .map(|o| {
                vec![
                    o.slice.clone().unwrap_or_else(|| "best effort".into()),
                    device_index(snap, &o.device_uuid),
                    size(o.bytes),
                    if o.importers > 0 {
                        format!("{} importers", o.importers)
                    } else {
                        "descriptors only".into()
                    },
                ]
            })
            .collect();
        out.extend(layout(
            &[
                ("EXPORTED, EXPORTER GONE: SLICE", Left),
                ("GPU", Right),
                ("MEMORY", Right),
                ("HELD BY", Left),
            ],
            &rows,
            "",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_nvidia_smi() {
        assert_eq!(size(512 << 20), "512 MiB");
        assert_eq!(size(3 << 29), "1.50 GiB");
        assert_eq!(percent(0.25), "25%");
        assert_eq!(percent(0.125), "12.5%");
    }

    #[test]
    fn names_from_the_ledger_cannot_drive_the_terminal() {
        let mut snap = crate::view::tests::sample();
        snap.slices[0].name = "evil\u{1b}[2J\u{1b}]0;owned\u{7}\u{9b}31m\u{202e}x\\".into();
        snap.devices[0].name = "GPU\r\nfake line".into();
        snap.processes[0].slice = snap.slices[0].name.clone();
        let text = render(&snap).join("\n");
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
            "{text:?}"
        );
        assert!(
            text.contains(r"evil\u{1b}[2J\u{1b}]0;owned\u{7}\u{9b}31m\u{202e}x\\"),
            "{text}"
        );
        assert!(text.contains(r"GPU\u{d}\u{a}fake line"), "{text}");
        // Plain names are shown as they are.
        assert_eq!(terminal_safe("train-0:a/b.c_d"), "train-0:a/b.c_d");
        // JSON stays exact.
        let json = snap.to_json();
        assert_eq!(json["slices"][0]["name"], snap.slices[0].name.as_str());
    }

    #[test]
    fn an_empty_table_says_so_under_its_headers() {
        let lines = render(&NodeView::default());
        for (header, none) in [
            ("GPU", "(no devices: NVML lists none"),
            ("SLICE", "(no slices)"),
            ("PID", "(no processes)"),
        ] {
            let at = lines.iter().position(|l| l.starts_with(header)).unwrap();
            assert!(lines[at + 1].starts_with(none), "{lines:#?}");
        }
    }

    #[test]
    fn tables_align_and_name_everything() {
        let lines = render(&crate::view::tests::sample());
        let text = lines.join("\n");
        assert!(text.contains("Fake GPU"), "{text}");
        assert!(text.contains("2 GiB / 4 GiB (50%)"), "{text}");
        assert!(text.contains("COMPUTE USED (1 s)"), "{text}");
        assert!(text.contains("never sum past 100%"), "{text}");
        assert!(text.contains("100,101"), "{text}");
        // The header and the rows of one table start their columns at the same place.
        let hdr = lines.iter().position(|l| l.starts_with("SLICE")).unwrap();
        let col = lines[hdr].find("GPU").unwrap();
        assert_eq!(&lines[hdr + 1][col + 2..col + 3], "0", "{text}");
    }
}
