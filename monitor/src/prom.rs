//! Prometheus text exposition (format 0.0.4) of a [`NodeView`]: one `gpuslice_` prefix, base
//! units (bytes, seconds), ratios 0..1, `_total` counters, `# HELP` and `# TYPE` for every
//! family. `gpuslice metrics` prints it once; the monitor serves it at `/metrics`.

use crate::view::NodeView;
use std::fmt::Write;

/// Extra facts only the running monitor knows, appended to the node's families.
#[derive(Debug, Default, Clone)]
pub struct MonitorFacts {
    /// Processes the monitor found dead and reaped since it started.
    pub reaped_total: u64,
    /// Per slice and device: device memory NVML reports for the slice's processes.
    pub audit: Vec<AuditRow>,
    /// Per device UUID: memory in use as NVML reports it, whoever holds it.
    pub device_observed: Vec<(String, u64)>,
    /// Node mode, per device UUID: the slices' unused reservations the monitor holds there
    /// (`crate::balloon`).
    pub balloons: Vec<(String, u64)>,
}

/// What NVML says a slice's processes really hold on a device.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRow {
    pub slice: String,
    pub device_uuid: String,
    /// Bytes NVML reports for the slice's processes on that device.
    pub observed: u64,
    /// The slice's quota there (`None`: best effort, nothing to exceed).
    pub limit: Option<u64>,
    /// The NVML pids counted (the monitor's PID namespace).
    pub pids: Vec<u32>,
    /// Per pid (same order): what NVML reports beyond what the process charged to the slice
    /// (all of it for a process the ledger does not know).
    pub excess: Vec<u64>,
    /// Per pid (same order): what NVML reports for it.
    pub held: Vec<u64>,
    /// The slice's ledger record (names are namespaced by owner, so two may share a name).
    pub index: usize,
    /// What the audit allows the counted processes beyond the quota: each its CUDA context
    /// (`--context-allowance`), which NVML counts and no quota does.
    pub allowance: u64,
}

impl AuditRow {
    /// Real usage beyond the quota and its processes' contexts: memory that did not go
    /// through gpuslice.
    pub fn over_quota(&self) -> bool {
        self.limit
            .is_some_and(|l| self.observed > l.saturating_add(self.allowance))
    }

    /// The pids `--on-violation kill` ends for a slice over its quota: first the processes that
    /// are themselves over (hold more than they charged and their context's allowance), the
    /// largest excess first, until what is left fits the quota and the allowance; so a bypass
    /// that names the slice cannot get its honest members killed. Only when the slice is still
    /// over with all of those gone are its other processes ended, the largest first: their
    /// charges together exceed the quota, which only a scribbled counter of the slice's own
    /// (its processes trust each other) makes possible.
    pub fn to_kill(&self) -> Vec<u32> {
        let Some(limit) = self.limit else {
            return vec![];
        };
        let mut by_excess: Vec<(u64, u32)> = self
            .excess
            .iter()
            .copied()
            .zip(self.pids.iter().copied())
            .filter(|&(e, _)| e > 0)
            .collect();
        by_excess.sort_unstable_by(|a, b| b.cmp(a));
        let limit = limit.saturating_add(self.allowance);
        let mut left = self.observed;
        let mut out = vec![];
        for (e, pid) in by_excess {
            if left <= limit {
                break;
            }
            out.push(pid);
            left = left.saturating_sub(e);
        }
        let mut by_held: Vec<(u64, u32)> = self
            .held
            .iter()
            .copied()
            .zip(self.pids.iter().copied())
            .filter(|(_, pid)| !out.contains(pid))
            .collect();
        by_held.sort_unstable_by(|a, b| b.cmp(a));
        for (h, pid) in by_held {
            if left <= limit {
                break;
            }
            out.push(pid);
            left = left.saturating_sub(h);
        }
        out
    }
}

/// A metric family being written.
struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl Family<'_> {
    /// One sample with its labels (name, value) in order.
    fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(self.name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        self.out.push(' ');
        self.out.push_str(&number(value));
        self.out.push('\n');
    }
}

/// Start a family: its HELP and TYPE lines.
fn family<'a>(out: &'a mut String, name: &'static str, kind: &str, help: &str) -> Family<'a> {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    Family { out, name }
}

/// A label value with `\`, `"` and newlines escaped as the format requires.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A sample value: integers without a fraction, `NaN`, `+Inf`, `-Inf` spelled as Prometheus does.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The exposition of the node, plus what the monitor knows when it is the one serving it.
pub fn render(snap: &NodeView, facts: Option<&MonitorFacts>) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "gpuslice_build_info",
        "gauge",
        "Build of the gpuslice binary serving these metrics; always 1.",
    )
    .sample(&[("version", env!("CARGO_PKG_VERSION"))], 1.0);

    let idx: Vec<String> = snap.devices.iter().map(|d| d.index.to_string()).collect();
    let dev_labels = |i: usize| {
        let d = &snap.devices[i];
        [
            ("uuid", d.uuid.as_str()),
            ("index", idx[i].as_str()),
            ("name", d.name.as_str()),
        ]
    };
    type DevField = fn(&crate::view::DeviceView) -> f64;
    let dev_families: [(&'static str, &str, DevField); 4] = [
        (
            "gpuslice_device_memory_total_bytes",
            "Device memory of the GPU.",
            |d| d.memory_total as f64,
        ),
        (
            "gpuslice_device_memory_reserved_bytes",
            "Device memory promised to slices (sum of their limits).",
            |d| d.memory_reserved as f64,
        ),
        (
            "gpuslice_device_memory_used_bytes",
            "Device memory held by slices, as the ledger accounts it.",
            |d| d.memory_used as f64,
        ),
        (
            "gpuslice_device_compute_reserved_ratio",
            "Sum of the compute shares guaranteed to slices on the device (0..1).",
            |d| d.compute_reserved,
        ),
    ];
    for (name, help, get) in dev_families {
        let mut f = family(&mut out, name, "gauge", help);
        for (i, d) in snap.devices.iter().enumerate() {
            f.sample(&dev_labels(i), get(d));
        }
    }

    type SliceField = fn(&crate::view::SliceView) -> Option<f64>;
    let slice_families: [(&'static str, &str, &str, SliceField); 12] = [
        (
            "gpuslice_slice_memory_limit_bytes",
            "gauge",
            "Memory quota of the slice on the device (absent for a best-effort slice).",
            |s| s.memory_limit.map(|l| l as f64),
        ),
        (
            "gpuslice_slice_memory_used_bytes",
            "gauge",
            "Device memory the slice holds.",
            |s| Some(s.memory_used as f64),
        ),
        (
            "gpuslice_slice_memory_contexts_bytes",
            "gauge",
            "Of the slice's memory, what its processes' CUDA contexts are charged (node mode).",
            |s| Some(s.memory_contexts as f64),
        ),
        (
            "gpuslice_slice_compute_share_ratio",
            "gauge",
            "Guaranteed compute share of the slice (0..1; 0 is best effort).",
            |s| Some(s.compute_share),
        ),
        (
            "gpuslice_slice_compute_cap_ratio",
            "gauge",
            "Hard compute ceiling of the slice (0..1; 1 is no ceiling).",
            |s| Some(s.compute_cap),
        ),
        (
            "gpuslice_slice_compute_used_ratio",
            "gauge",
            "The slice's part of the device's busy time over the last second (0..1; a device's slices sum to at most 1).",
            |s| Some(s.compute_used),
        ),
        (
            "gpuslice_slice_processes",
            "gauge",
            "Live processes attached to the slice.",
            |s| Some(s.pids.len() as f64),
        ),
        (
            "gpuslice_slice_allocations_denied_total",
            "counter",
            "Allocations refused because they would exceed the slice's memory quota.",
            |s| Some(s.allocations_denied as f64),
        ),
        (
            "gpuslice_slice_violations_total",
            "counter",
            "Times the monitor's NVML audit found the slice over its quota (memory taken around gpuslice).",
            |s| Some(s.violations_total as f64),
        ),
        (
            "gpuslice_slice_over_quota",
            "gauge",
            "1 while the monitor's NVML audit finds the slice over its quota.",
            |s| Some(s.over_quota as u8 as f64),
        ),
        (
            "gpuslice_slice_launches_total",
            "counter",
            "Kernel and graph launches of the slice.",
            |s| Some(s.launches as f64),
        ),
        (
            "gpuslice_slice_throttled_seconds_total",
            "counter",
            "Time launches of the slice waited for their compute turn.",
            |s| Some(s.throttled_seconds),
        ),
    ];
    // What a slice is for, as labels: the scheduler's priority class and, for a slice the DRA
    // plugin made, the Kubernetes claim (`namespace/name`; empty otherwise).
    let mut f = family(
        &mut out,
        "gpuslice_slice_info",
        "gauge",
        "Always 1; labels: the slice's priority class and its Kubernetes claim (namespace/name), if any.",
    );
    for s in &snap.slices {
        f.sample(
            &[
                ("slice", &s.name),
                ("device_uuid", &s.device_uuid),
                ("priority", s.priority),
                ("claim", s.claim.as_deref().unwrap_or("")),
            ],
            1.0,
        );
    }
    for (name, kind, help, get) in slice_families {
        let mut f = family(&mut out, name, kind, help);
        for s in &snap.slices {
            if let Some(v) = get(s) {
                f.sample(&[("slice", &s.name), ("device_uuid", &s.device_uuid)], v);
            }
        }
    }

    if let Some(facts) = facts {
        let mut f = family(
            &mut out,
            "gpuslice_slice_memory_observed_bytes",
            "gauge",
            "Device memory NVML reports for the slice's processes (the audit).",
        );
        for a in &facts.audit {
            f.sample(
                &[("slice", &a.slice), ("device_uuid", &a.device_uuid)],
                a.observed as f64,
            );
        }
        let mut f = family(
            &mut out,
            "gpuslice_device_memory_observed_bytes",
            "gauge",
            "Device memory in use as NVML reports it, whoever holds it (also programs without gpuslice).",
        );
        for (uuid, used) in &facts.device_observed {
            f.sample(&[("uuid", uuid)], *used as f64);
        }
        let mut f = family(
            &mut out,
            "gpuslice_device_memory_held_bytes",
            "gauge",
            "Node mode: reserved memory no slice uses, held on the device by the monitor so that nobody else can take it (balloons).",
        );
        for (uuid, held) in &facts.balloons {
            f.sample(&[("uuid", uuid)], *held as f64);
        }
        family(
            &mut out,
            "gpuslice_monitor_reaped_processes_total",
            "counter",
            "Dead processes whose memory and leases this monitor returned to their slices.",
        )
        .sample(&[], facts.reaped_total as f64);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #34: a slice over its quota with no process itself over (its members' charges
    /// together exceed the quota: its counter was scribbled) loses its largest processes until
    /// it fits; a bypass that names it goes first, and alone when that is enough.
    #[test]
    fn a_scribbled_slice_loses_its_largest_processes_until_it_fits() {
        const GI: u64 = 1 << 30;
        let row = |pids: Vec<u32>, held: Vec<u64>, excess: Vec<u64>| AuditRow {
            observed: held.iter().sum(),
            pids,
            held,
            excess,
            allowance: 0,
            index: 0,
            slice: "t1s".into(),
            device_uuid: "GPU-x".into(),
            limit: Some(GI),
        };
        // Three members charged 768 MiB, 512 MiB and 256 MiB on a 1 GiB quota.
        let r = row(
            vec![1, 2, 3],
            vec![768 << 20, 512 << 20, 256 << 20],
            vec![0, 0, 0],
        );
        assert!(r.over_quota());
        assert_eq!(r.to_kill(), [1]);
        // A bypass naming the slice with 1 GiB: it alone goes, the members fit without it.
        let r = row(
            vec![1, 2, 9],
            vec![512 << 20, 256 << 20, GI],
            vec![0, 0, GI],
        );
        assert_eq!(r.to_kill(), [9]);
        // Within the quota: nobody.
        let r = row(vec![1, 2], vec![512 << 20, 256 << 20], vec![0, 0]);
        assert!(r.to_kill().is_empty());
    }

    #[test]
    fn every_family_has_help_and_type_and_escapes_labels() {
        let facts = MonitorFacts {
            reaped_total: 2,
            audit: vec![AuditRow {
                pids: vec![],
                excess: vec![],
                held: vec![],
                allowance: 0,
                index: 0,
                slice: "train".into(),
                device_uuid: "GPU-x".into(),
                observed: 5,
                limit: Some(4),
            }],
            device_observed: vec![("GPU-x".into(), 7)],
            balloons: vec![("GPU-x".into(), 3)],
        };
        let text = render(&crate::view::tests::sample(), Some(&facts));
        assert!(
            text.contains("gpuslice_device_memory_observed_bytes{uuid=\"GPU-x\"} 7"),
            "{text}"
        );
        let mut helps = 0;
        let mut types = 0;
        for line in text.lines() {
            if line.starts_with("# HELP gpuslice_") {
                helps += 1;
            } else if line.starts_with("# TYPE gpuslice_") {
                types += 1;
            } else {
                assert!(line.starts_with("gpuslice_"), "{line}");
            }
        }
        assert_eq!(helps, types);
        assert!(text.contains("slice=\"infer \\\"a\\\"\""), "{text}");
        assert!(text.contains("gpuslice_slice_memory_limit_bytes{slice=\"train\",device_uuid=\"GPU-00000000-0000-0000-0000-000000000000\"} 4294967296"), "{text}");
        // One family per name: the audit's verdict is read from the ledger, where the monitor
        // keeps it, never written twice.
        assert_eq!(
            text.matches("# TYPE gpuslice_slice_over_quota ").count(),
            1,
            "{text}"
        );
        assert!(
            text.contains("gpuslice_slice_info{slice=\"train\",device_uuid=\"GPU-00000000-0000-0000-0000-000000000000\",priority=\"normal\",claim=\"\"} 1"),
            "{text}"
        );
        assert!(text.contains("gpuslice_slice_throttled_seconds_total{slice=\"train\",device_uuid=\"GPU-00000000-0000-0000-0000-000000000000\"} 1.5"), "{text}");
    }

    #[test]
    fn numbers_are_spelled_as_prometheus_reads_them() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }
}
