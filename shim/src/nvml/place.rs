//! Where the caller stands on one device ([`Place`]: inside a slice, with its figures, or
//! outside), found from its own accounts after `cuInit` or from the read-only ledger before,
//! and the live processes of its slice as NVML answers show them. Every hook comes in through
//! [`with_place`] or [`with_slice_processes`], and answers through [`answer_or_pass`]: apart
//! so that memory, process lists and utilisation read one view of the slice.

use super::cache::{lock_cache, Cache, Member};
use crate::init::{state_if_ready, State};
use crate::report::Figures;
use gpuslice_abi::*;
use gpuslice_ledger::procfs::INITIAL_PID_NS;
use gpuslice_ledger::view::{PidMap, View};

/// What the caller is, on one device.
pub(super) enum Place {
    /// Outside any slice: the real device (process lists, utilisation). A CUDA process without
    /// slice settings still runs best effort: `memory` then holds those figures, so NVML and
    /// CUDA agree on its memory.
    Outside {
        /// Best-effort limit, what the pool holds (as in `Inside`), for an attached process.
        memory: Option<Figures>,
    },
    /// Inside a slice.
    Inside {
        /// Quota or best-effort limit, what the account holds, whether it is a quota
        /// (`None`: no figures of its own, the real memory).
        memory: Option<Figures>,
        /// Ledger device and slice indices, when the ledger has the slice.
        found: Option<(usize, usize)>,
    },
}

impl Cache {
    /// Where the caller stands on device `di`. `real_total` resolves a `25%` quota when the
    /// ledger does not know the device yet.
    pub(super) fn place(
        &mut self,
        st: Option<&'static State>,
        di: usize,
        real_total: u64,
    ) -> Place {
        if self.config.is_none() {
            return Place::Outside { memory: None };
        }
        if let Some(st) = st {
            return self.place_attached(st, di);
        }
        let Some(ordinal) = self.devs[di].ordinal.filter(|_| self.in_slice) else {
            return Place::Outside { memory: None };
        };
        let configured = self
            .config
            .as_ref()
            .and_then(|c| c.memory.as_ref())
            .and_then(|m| m.get(ordinal))
            .map(|(size, _)| size);
        self.refresh_ledger();
        let Cache {
            ro,
            devs,
            slice_name,
            ..
        } = self;
        let Some(v) = ro.as_ref().map(|r| r.view()) else {
            return Place::Inside {
                memory: configured.map(|size| quota(size.resolve(real_total), 0, 0)),
                found: None,
            };
        };
        let d = &mut devs[di];
        let gen = v.generation();
        if d.gen != gen {
            d.gen = gen;
            d.ledger_dev = v.find_device(d.uuid());
            d.slice = d
                .ledger_dev
                .and_then(|ld| v.find_slice(slice_name.as_deref()?, ld));
            d.members.clear();
            if let Some(si) = d.slice {
                d.members.extend(v.members(si).map(|s| s as u16));
            }
        }
        let Some(ld) = d.ledger_dev else {
            return Place::Inside {
                memory: configured.map(|size| quota(size.resolve(real_total), 0, 0)),
                found: None,
            };
        };
        match d.slice.and_then(|si| v.slice(si)) {
            Some(s) => Place::Inside {
                memory: Some(match s.memory_limit {
                    Some(l) => quota(l, s.memory_used, s.balloon_held),
                    None => best_effort(&v, ld),
                }),
                found: Some((ld, s.index)),
            },
            // The device is known but the slice not made yet: what cuInit would give.
            None => {
                let total = v.device(ld).map_or(real_total, |x| x.memory_total);
                Place::Inside {
                    memory: Some(match configured {
                        Some(size) => quota(size.resolve(total), 0, 0),
                        None => best_effort(&v, ld),
                    }),
                    found: None,
                }
            }
        }
    }

    /// A process that attached at `cuInit`: its own accounts and ledger.
    fn place_attached(&mut self, st: &'static State, di: usize) -> Place {
        let d = &mut self.devs[di];
        let Some(ds) = st.devices.iter().find(|x| x.uuid.as_bytes() == d.uuid()) else {
            return Place::Outside { memory: None }; // CUDA cannot see this device
        };
        let memory = Some(Figures {
            quota: ds.account.is_quota(),
            limit: ds.account.limit(),
            used: ds.account.used(),
            held: ds.account.held_for_it(),
        });
        if !self.in_slice {
            // Its private best-effort slice: the CUDA view of memory, the real rest.
            return Place::Outside {
                memory: memory.filter(|m| !m.quota),
            };
        }
        let v = View::of(st.ledger);
        let slice = v.process(st.me.slot, ds.ledger_dev).and_then(|p| p.slice);
        let gen = v.generation();
        if d.gen != gen || d.slice != slice {
            d.gen = gen;
            d.ledger_dev = Some(ds.ledger_dev);
            d.slice = slice;
            d.members.clear();
            if let Some(si) = slice {
                d.members.extend(v.members(si).map(|s| s as u16));
            }
        }
        Place::Inside {
            memory,
            found: slice.map(|si| (ds.ledger_dev, si)),
        }
    }
}

/// A best-effort account on ledger device `ld`, as `Account::limit`/`used` compute it.
fn best_effort(v: &View<'_>, ld: usize) -> Figures {
    let (limit, used) = v.device(ld).map_or((0, 0), |d| {
        (d.memory_total - d.memory_reserved, d.best_effort_used)
    });
    Figures {
        quota: false,
        limit,
        used,
        held: 0,
    }
}

/// A quota's figures.
fn quota(limit: u64, used: u64, held: u64) -> Figures {
    Figures {
        quota: true,
        limit,
        used,
        held,
    }
}

/// What a hook gets to work with on one device.
pub(super) struct Ctx<'a> {
    pub(super) place: Place,
    /// The ledger the place refers to.
    pub(super) view: Option<View<'a>>,
    pids: &'a mut PidMap,
    list: &'a mut Vec<Member>,
    /// Process slots of the slice (as of the ledger generation last seen).
    members: &'a [u16],
}

/// Run `f` with the caller's place on device `dev`; `None` when NVML cannot describe the
/// device (the caller then keeps the real answer).
pub(super) fn with_place<R>(
    dev: nvmlDevice_t,
    real_total: u64,
    f: impl FnOnce(Ctx<'_>) -> R,
) -> Option<R> {
    let mut g = lock_cache();
    let cache = g.as_mut()?;
    let di = cache.dev(dev)?;
    let st = state_if_ready();
    let place = cache.place(st, di, real_total);
    let Cache {
        ro,
        devs,
        pids,
        list,
        ..
    } = cache;
    let view = match st {
        Some(st) => Some(View::of(st.ledger)),
        None => ro.as_ref().map(|r| r.view()),
    };
    Some(f(Ctx {
        place,
        view,
        pids,
        list,
        members: &devs[di].members,
    }))
}

/// `f` of the live processes of the caller's slice on `dev`. `None`: outside any slice (pass
/// the real answer through).
pub(super) fn with_slice_processes<R>(
    dev: nvmlDevice_t,
    f: impl FnOnce(&[Member]) -> R,
) -> Option<R> {
    with_place(dev, 0, |c| {
        let Place::Inside { found, .. } = c.place else {
            return None;
        };
        c.list.clear();
        if let (Some((ld, si)), Some(v)) = (found, c.view) {
            for &slot in c.members {
                let slot = slot as usize;
                let Some(p) = v.process(slot, ld) else {
                    continue;
                };
                if p.slice != Some(si) || !v.is_alive(slot) {
                    continue;
                }
                if let Some(pid) = c.pids.pid_here(&p) {
                    let nvml_pid = if p.pid_ns == INITIAL_PID_NS {
                        Some(p.pid)
                    } else {
                        c.pids.in_initial_namespace().then_some(pid)
                    };
                    c.list.push(Member {
                        pid,
                        bytes: p.charged,
                        nvml_pid,
                    });
                }
            }
        }
        Some(f(c.list))
    })
    .flatten()
}

/// A hook that corrects what NVML wrote: `r` is NVML's status for the program's struct `out`;
/// when the call succeeded and `out` is there, `edit` puts the slice's figures over the
/// device's. Returns `r`.
///
/// # Safety
/// `out` is null or the program's struct that NVML's call `r` was given (so, on success,
/// filled in, in a version NVML accepted, and valid for writes).
pub(super) unsafe fn corrected<T>(r: u32, out: *mut T, edit: impl FnOnce(&mut T)) -> u32 {
    if r != NVML_SUCCESS || out.is_null() {
        return r;
    }
    // SAFETY: out is non-null (checked above) and, by this function's contract, the program's
    // struct that NVML's successful call filled in; ours to overwrite.
    edit(unsafe { &mut *out });
    r
}

/// A hook's answer: `pass` (the real answer) outside any slice, else the status, with the
/// count needed or listed stored through `store` where there is one.
pub(super) fn answer_or_pass(
    answer: Option<(u32, Option<usize>)>,
    pass: impl FnOnce() -> u32,
    store: impl FnOnce(usize),
) -> u32 {
    match answer {
        None => pass(),
        Some((r, n)) => {
            if let Some(n) = n {
                store(n);
            }
            r
        }
    }
}
