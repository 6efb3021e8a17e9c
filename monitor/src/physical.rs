//! Node mode: the device as it physically is (issue #34). The ledger admits a reservation when
//! the quotas fit the device's size; the memory can still be gone: programs outside gpuslice
//! (bypassers, other driver users), the monitor's own context, and reservations the balloons
//! could not hold yet all take it. So a new reservation is admitted only when what NVML shows
//! free, less the other slices' reservations the balloons do not hold yet, can take it; a
//! refusal says so and names whose memory is outside gpuslice (pid, uid, bytes).

use crate::nvml::Nvml;
use gpuslice_ledger::layout::{NO_LIMIT, STATE_ACTIVE};
use gpuslice_ledger::region::Regions;
use gpuslice_ledger::Ledger;
use std::sync::atomic::Ordering::SeqCst;

/// What a device can still take, as it physically is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Room {
    /// Free by NVML.
    pub free: u64,
    /// Of that, what other slices reserved and the balloons do not hold (yet): it is theirs.
    pub owed: u64,
    /// Processes holding memory on the device that the ledger does not know (not the
    /// monitor): pid, uid (if readable), bytes; largest first.
    pub outside: Vec<(u32, Option<u32>, u64)>,
}

impl Room {
    /// What a new reservation may take.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.owed)
    }

    /// `", memory held outside gpuslice: pid 12 (uid 1000) 6 GiB, ..."`, or nothing.
    pub fn outside_text(&self) -> String {
        if self.outside.is_empty() {
            return String::new();
        }
        let each: Vec<String> = self
            .outside
            .iter()
            .take(4)
            .map(|(pid, uid, b)| {
                format!(
                    "pid {pid} (uid {}) {}",
                    uid.map_or("?".into(), |u| u.to_string()),
                    crate::table::size(*b)
                )
            })
            .collect();
        let more = self.outside.len().saturating_sub(4);
        format!(
            "; memory held outside gpuslice: {}{}",
            each.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    }
}

/// The room on device `uuid` (ledger index `dev`); `None` when NVML cannot say (no NVML, a
/// device it does not list).
pub fn room(
    ledger: &Ledger,
    regions: &dyn Regions,
    nvml: &Nvml,
    balloons: bool,
    dev: usize,
    uuid: &str,
) -> Option<Room> {
    let gpu = nvml.devices().ok()?.into_iter().find(|g| g.uuid == uuid)?;
    let free = gpu.memory_total.saturating_sub(gpu.memory_used);
    let mut owed = 0u64;
    for (si, s) in ledger.slices().iter().enumerate() {
        let limit = s.memory_limit.load(SeqCst);
        if s.state.load(SeqCst) != STATE_ACTIVE
            || limit == NO_LIMIT
            || s.device.load(SeqCst) as usize != dev
        {
            continue;
        }
        // The region's counter is the slice's own (hostile: clamped); it only moves what is
        // owed to that slice.
        let used = regions
            .get(si as u32)
            .map_or(0, |r| r.header().memory_used.load(SeqCst))
            .min(limit);
        let held = if balloons {
            s.balloon_held.load(SeqCst)
        } else {
            0
        };
        owed = owed.saturating_add((limit - used).saturating_sub(held));
    }
    let me = std::process::id();
    let known = |pid: u32| ledger.has_active_pid(pid);
    let mut outside: Vec<(u32, Option<u32>, u64)> = nvml
        .processes(gpu.index)
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .filter(|&(pid, _)| pid != me && !known(pid))
        .map(|(pid, b)| (pid, crate::procfs::uid_of(pid), b))
        .collect();
    outside.sort_by_key(|o| std::cmp::Reverse(o.2));
    Some(Room {
        free,
        owed,
        outside,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_new_reservation_may_take_and_whose_memory_is_outside() {
        let r = Room {
            free: 6 << 30,
            owed: 1 << 30,
            outside: vec![(12, Some(1000), 6 << 30), (13, None, 1 << 20)],
        };
        assert_eq!(r.available(), 5 << 30);
        assert_eq!(
            r.outside_text(),
            "; memory held outside gpuslice: pid 12 (uid 1000) 6 GiB, pid 13 (uid ?) 1 MiB"
        );
        let none = Room {
            free: 1,
            owed: 2,
            outside: vec![],
        };
        assert_eq!((none.available(), none.outside_text()), (0, String::new()));
    }
}
