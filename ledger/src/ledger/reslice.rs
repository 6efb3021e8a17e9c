//! Live re-slicing: [`Ledger::set_slice`] changes a running slice's quota, share, cap or
//! priority class under the ledger's lock, with admission re-checked against what its device
//! has left. Nothing else needs telling: the hot paths read the slice record on every use, so
//! a memory limit applies to the next allocation ([`crate::Account`] compares against the
//! record's `memory_limit`), and a share, cap or class to the next lease the scheduler grants
//! or charges (it reads them through `tenants.rs` at every pick): within one turn.

use core::sync::atomic::Ordering::*;

use super::Ledger;
use crate::error::{human_bytes, FitError, LedgerError};
use crate::layout::{Cap, Share, NO_LIMIT, PPM};

/// What `gpuslice slice set` changes (None: leave as it is).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceChange {
    /// New memory quota in bytes.
    pub memory: Option<u64>,
    /// New guaranteed compute share.
    pub compute_share: Option<Share>,
    /// New compute cap.
    pub compute_cap: Option<Cap>,
    /// New priority class ([`gpuslice_sched::CLASS_NORMAL`] or [`gpuslice_sched::CLASS_LATENCY`]).
    pub class: Option<u32>,
}

fn frac(ppm: u64) -> String {
    format!("{:.2}", ppm as f64 / PPM as f64)
}

impl Ledger {
    /// Change the slices called `name` (the operator's, one per device it exists on, else every
    /// tenant's of that name: `Ledger::operator_targets`); all or nothing: each
    /// change is checked on every record first. Refused: lowering the quota below what the
    /// slice uses now (the message says requested and used), a quota or share that does not fit
    /// what the device has left (requested and available), a quota on a best-effort slice, a
    /// cap below the share. Returns how many records changed.
    pub fn set_slice(&self, name: &str, change: &SliceChange) -> Result<usize, LedgerError> {
        let _g = self.lock()?;
        let records = self.operator_targets(name);
        if records.is_empty() {
            return Err(LedgerError::NoSuchSlice(name.into()));
        }
        for &si in &records {
            self.check_change(si, change)?;
        }
        for &si in &records {
            self.apply_change(si, change);
        }
        Ok(records.len())
    }

    fn check_change(&self, si: usize, c: &SliceChange) -> Result<(), LedgerError> {
        let s = &self.slices()[si];
        let d = &self.devices()[s.device.load(SeqCst) as usize];
        let uuid = d.uuid.get();
        if let Some(l) = c.memory {
            let old = s.memory_limit.load(SeqCst);
            if old == NO_LIMIT {
                return Err(FitError {
                    setting: "--memory".into(),
                    device: uuid,
                    requested: human_bytes(l),
                    available: "none: a best-effort slice has no quota to change".into(),
                }
                .into());
            }
            let used = s.memory_used.0.load(SeqCst);
            if l < used {
                return Err(FitError {
                    setting: "--memory".into(),
                    device: uuid,
                    requested: human_bytes(l),
                    available: format!("no less than the {} in use", human_bytes(used)),
                }
                .into());
            }
            let others = d.memory_reserved.load(SeqCst).saturating_sub(old);
            let be = d.best_effort_used.load(SeqCst);
            let total = d.memory_total.load(SeqCst);
            if others.saturating_add(l).saturating_add(be) > total {
                return Err(FitError {
                    setting: "--memory".into(),
                    device: uuid,
                    requested: human_bytes(l),
                    available: human_bytes(total.saturating_sub(others).saturating_sub(be)),
                }
                .into());
            }
        }
        let share = c.compute_share.unwrap_or_else(|| s.share());
        if let Some(new) = c.compute_share {
            let old = s.compute_share_ppm.load(SeqCst) as u64;
            let others = d.compute_reserved.load(SeqCst).saturating_sub(old);
            if !gpuslice_sched::admits(others, new) {
                return Err(FitError {
                    setting: "--compute".into(),
                    device: uuid,
                    requested: frac(new.ppm() as u64),
                    available: frac((PPM as u64).saturating_sub(others)),
                }
                .into());
            }
        }
        let cap = c.compute_cap.unwrap_or_else(|| s.cap());
        if let Some(cap) = cap.limit().filter(|&c| c < share) {
            return Err(FitError {
                setting: "--compute-cap".into(),
                device: uuid,
                requested: frac(cap.ppm() as u64),
                available: format!("no less than the share {}", frac(share.ppm() as u64)),
            }
            .into());
        }
        Ok(())
    }

    fn apply_change(&self, si: usize, c: &SliceChange) {
        let s = &self.slices()[si];
        let d = &self.devices()[s.device.load(SeqCst) as usize];
        if let Some(l) = c.memory {
            let old = s.memory_limit.swap(l, SeqCst);
            let _ = d.memory_reserved.fetch_update(SeqCst, SeqCst, |v| {
                Some(v.saturating_sub(old).saturating_add(l))
            });
        }
        if let Some(new) = c.compute_share {
            let old = s.compute_share_ppm.swap(new.ppm(), SeqCst) as u64;
            let _ = d.compute_reserved.fetch_update(SeqCst, SeqCst, |v| {
                Some(v.saturating_sub(old).saturating_add(new.ppm() as u64))
            });
        }
        if let Some(cap) = c.compute_cap {
            s.compute_cap_ppm.store(cap.ppm(), SeqCst);
        }
        if let Some(class) = c.class {
            s.sched.class.store(class, SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{OperatorSlice, SliceRequest};

    fn ledger() -> (Ledger, std::path::PathBuf, usize) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gpuslice-reslice-{}-{}",
            std::process::id(),
            N.fetch_add(1, Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let l = Ledger::open_or_create(&dir).unwrap();
        let dev = l
            .ensure_device("GPU-00000000-0000-0000-0000-00000000000a", "Fake", 8 << 30)
            .unwrap();
        (l, dir, dev)
    }

    fn operator(l: &Ledger, name: &str, memory: u64, share: f64) {
        l.create_operator_slice(&OperatorSlice {
            name: name.into(),
            device: "GPU-00000000-0000-0000-0000-00000000000a".into(),
            memory,
            compute_share: Share::from_ppm((share * PPM as f64) as u32),
            compute_cap: Cap::NONE,
            claim: None,
        })
        .unwrap();
    }

    /// [`ledger`] with the operator slices `a` (2 GiB, share 0.25) and `b` (2 GiB, share 0.5).
    fn a_and_b() -> (Ledger, std::path::PathBuf) {
        let (l, dir, _) = ledger();
        operator(&l, "a", 2 << 30, 0.25);
        operator(&l, "b", 2 << 30, 0.5);
        (l, dir)
    }

    #[test]
    fn a_change_applies_to_the_record_and_the_device_sums() {
        let (l, dir) = a_and_b();
        let change = SliceChange {
            memory: Some(3 << 30),
            compute_share: Some(Share::from_ppm(500_000)),
            compute_cap: Some(Cap::from_ppm(750_000)),
            class: Some(gpuslice_sched::CLASS_LATENCY),
        };
        assert_eq!(l.set_slice("a", &change).unwrap(), 1);
        let s = l.snapshot();
        let a = s.slices.iter().find(|s| s.name == "a").unwrap();
        assert_eq!(a.memory_limit, Some(3 << 30));
        assert_eq!(a.compute_share.ppm(), 500_000);
        assert_eq!(s.devices[0].memory_reserved, 5 << 30);
        assert_eq!(l.devices()[0].compute_reserved.load(SeqCst), 1_000_000);
        assert_eq!(
            l.slices()
                .iter()
                .find(|r| r.name.get() == "a")
                .unwrap()
                .sched
                .class
                .load(SeqCst),
            gpuslice_sched::CLASS_LATENCY
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn admission_is_rechecked_and_nothing_changes_on_refusal() {
        let (l, dir) = a_and_b();
        // Each refusal, in turn, with what its message names.
        let share = SliceChange {
            compute_share: Some(Share::from_ppm(600_000)),
            ..Default::default()
        };
        let memory_and_share = SliceChange {
            memory: Some(7 << 30),
            compute_share: Some(Share::from_ppm(100_000)),
            ..Default::default()
        };
        let cap_below_share = SliceChange {
            compute_cap: Some(Cap::from_ppm(100_000)),
            ..Default::default()
        };
        for (change, says) in [
            (share, "requested 0.60, available 0.50"),
            (memory_and_share, "requested 7 GiB, available 6 GiB"),
            (cap_below_share, "--compute-cap"),
        ] {
            let e = l.set_slice("a", &change).unwrap_err().to_string();
            assert!(e.contains(says), "{change:?}: {e}");
            // All or nothing: the share did not change either.
            assert_eq!(l.devices()[0].compute_reserved.load(SeqCst), 750_000);
        }
        assert!(matches!(
            l.set_slice("nope", &SliceChange::default()),
            Err(LedgerError::NoSuchSlice(_))
        ));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn lowering_a_quota_below_its_use_is_refused_with_both_figures() {
        let (l, dir, dev) = ledger();
        let me = l.attach("").unwrap();
        let req = SliceRequest::new(Some("m"), Some(2 << 30));
        l.join(me, dev, &req).unwrap();
        let acct = l.account(me, dev).unwrap();
        assert!(acct.try_charge(1 << 30));
        let lower = |b: u64| {
            l.set_slice(
                "m",
                &SliceChange {
                    memory: Some(b),
                    ..Default::default()
                },
            )
        };
        let e = lower(512 << 20).unwrap_err().to_string();
        assert!(
            e.contains("requested 512 MiB") && e.contains("1 GiB in use"),
            "{e}"
        );
        // At or above the use: the next allocation meets the new limit.
        lower(1 << 30).unwrap();
        assert!(!acct.try_charge(1));
        acct.uncharge(1 << 30);
        l.detach(me).unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
