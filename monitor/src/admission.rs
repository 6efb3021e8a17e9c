//! Node mode: the monitor's admission socket (`monitor.sock`) and the slice regions it hands
//! out (docs/security.md).
//!
//! One thread accepts; each connection gets its own short-lived thread (at most
//! [`MAX_CONNECTIONS`] at once, [`MAX_PER_UID`] per uid, each with a [`IO_TIMEOUT`] deadline),
//! so a slow or silent client delays nobody else. Who asks is what the kernel says
//! (`SO_PEERCRED`: pid and uid), bound at accept to the process that connected (a pidfd:
//! `gpuslice_ledger::pidfd`), so a request read later from a connection whose maker exited is
//! refused, whoever holds its pid by then; the pid's start time and `NSpid` come from `/proc`,
//! read by the monitor; nothing the client claims about itself is used for identity.
//!
//! Requests (see `gpuslice_protocol`): `admit` (a shim at `cuInit`), `slice-create`,
//! `slice-rm`, `slice-set`, `slice-priority` (the operator CLI: root, or a member of the
//! operator group),
//! `view` (a read-only descriptor of one slice's region, for the slice's own uid or root),
//! `release` (an admitted process the driver refused memory: pieces of its own slice's balloon,
//! `crate::balloon`), `share-export`, `share-import`, `share-leave`, `share-let-go` (an
//! admitted process's exported VMM allocations, `crate::shared`).

use crate::error::{Error, RequestError};
use crate::regions::RegionTable;
use gpuslice_ledger::layout::STATE_ACTIVE;
use gpuslice_ledger::node::{DeviceAsk, Limits, Peer, Policy};
use gpuslice_ledger::pidfd::PeerProcess;
use gpuslice_ledger::region::Regions;
use gpuslice_ledger::secret::Secret;
use gpuslice_ledger::{Ledger, LedgerError, OperatorSlice, ProcHandle, SliceRequest};
use gpuslice_protocol::{
    self as protocol, AdmitReply, AdmitRequest, Done, GrantedDevice, Ping, Pong, Refusal, Released,
    Reply, Request, ShareImport, SliceCreate, SliceSet, Viewed, Why, SOCKET_FILE,
};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Connections served at once; more are closed at once (the client retries).
pub const MAX_CONNECTIONS: usize = 64;
/// Connections one uid may have open at once.
pub const MAX_PER_UID: usize = 8;
/// Deadline of every read and write on a connection.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// The group whose members may use the operator requests, besides root.
pub struct OperatorGroup {
    /// Its name, for the refusal's message.
    pub name: String,
    /// Its gid (`None`: no such group on this node).
    pub gid: Option<u32>,
}

/// What the socket thread needs.
pub struct Server {
    /// The policy, which only this monitor holds.
    pub policy: Policy,
    pub regions: Arc<RegionTable>,
    pub limits: Limits,
    /// The operator group (`--operator-group`).
    pub operator_group: OperatorGroup,
    /// The slices' unused reservations held on the GPUs (`None`: `--balloons off`, or no
    /// driver).
    pub balloons: Option<Arc<crate::balloon::Balloons>>,
    /// What new reservations are checked against as the devices physically are
    /// (`crate::physical`); `None`: NVML unavailable (the ledger's check alone).
    pub nvml: Option<crate::nvml::Nvml>,
}

/// Bind `monitor.sock` in the (checked, root-owned) runtime directory, mode 0666.
pub fn bind(ledger: &Ledger) -> Result<OwnedFd, Error> {
    let dirfd = ledger.dir().fd();
    let _ = ledger.dir().unlink(SOCKET_FILE);
    // SAFETY: constants.
    let s = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(Error::os(
            "create the admission socket",
            None,
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: just created, ours.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    let path = format!("/proc/self/fd/{dirfd}/{SOCKET_FILE}");
    let addr = protocol::unix_addr(&path).map_err(Error::Protocol)?;
    // SAFETY: valid socket and address.
    let r = unsafe {
        libc::bind(
            s.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            size_of::<libc::sockaddr_un>() as u32,
        )
    };
    let name = std::ffi::CString::new(SOCKET_FILE).expect("no NUL");
    // SAFETY: valid socket; valid dirfd and name (fchmodat never follows: the name is the
    // socket we just bound in a directory only root writes).
    if r != 0
        // SAFETY: as above: valid dirfd and NUL-terminated name, no link followed.
        || unsafe { libc::fchmodat(dirfd, name.as_ptr(), 0o666, 0) } != 0
        // SAFETY: `s` is our open, bound socket.
        || unsafe { libc::listen(s.as_raw_fd(), 128) } != 0
    {
        return Err(Error::os(
            "serve",
            Some(ledger.dir().path().join(SOCKET_FILE)),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(s)
}

/// Accept and serve connections until the process exits.
pub fn serve(listener: OwnedFd, server: Arc<Server>) {
    static OPEN: AtomicUsize = AtomicUsize::new(0);
    let per_uid: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
    loop {
        // SAFETY: valid listening socket; null address out-parameters are allowed.
        let c = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if c < 0 {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        // SAFETY: accepted, ours.
        let c = unsafe { OwnedFd::from_raw_fd(c) };
        let Some((pid, uid, _)) = protocol::peer(c.as_raw_fd()) else {
            continue;
        };
        // Bound now to the process that connected, not to its pid number (issue #27).
        let peer = PeerProcess::at_accept(c.as_raw_fd(), pid);
        if OPEN.load(SeqCst) >= MAX_CONNECTIONS {
            continue; // dropped: the client retries
        }
        {
            let mut m = per_uid.lock().unwrap_or_else(|e| e.into_inner());
            let n = m.entry(uid).or_insert(0);
            if *n >= MAX_PER_UID {
                let _ = protocol::answer(
                    c.as_raw_fd(),
                    &Err(Refusal::other(format!(
                        "uid {uid} has {MAX_PER_UID} requests in flight already"
                    ))),
                );
                continue;
            }
            *n += 1;
        }
        OPEN.fetch_add(1, SeqCst);
        let (server, per_uid) = (server.clone(), per_uid.clone());
        let spawned = std::thread::Builder::new()
            .name("admission".into())
            .spawn(move || {
                protocol::set_timeouts(c.as_raw_fd(), IO_TIMEOUT);
                handle(&server, c.as_raw_fd(), &peer, uid);
                OPEN.fetch_sub(1, SeqCst);
                if let Some(n) = per_uid
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(&uid)
                {
                    *n = n.saturating_sub(1);
                }
            });
        if spawned.is_err() {
            OPEN.fetch_sub(1, SeqCst);
        }
    }
}

fn handle(server: &Server, sock: RawFd, peer: &PeerProcess, uid: u32) {
    let Some((req, fds)) = protocol::receive(sock) else {
        return;
    };
    // Whoever connected must still be the process behind the pid when its request is read:
    // a connection whose maker exited is refused, whoever holds its pid now.
    let answered = peer
        .check()
        .map_err(|e| Refusal::other(e.to_string()))
        .and_then(|()| answer(server, req?, &fds, peer.pid, uid));
    let _ = protocol::answer(sock, &answered);
}

/// The peer's identity as `/proc` shows it to the monitor (after [`PeerProcess::check`]).
fn peer_of(pid: u32, uid: u32) -> Result<Peer, RequestError> {
    let start_time = gpuslice_ledger::live_start_time_of(&pid.to_string());
    if start_time == 0 {
        return Err(RequestError::Gone(pid));
    }
    let nspid = gpuslice_ledger::innermost_pid_of(pid).unwrap_or(pid);
    Ok(Peer {
        host_pid: pid,
        nspid,
        uid,
        start_time,
        pid_ns: gpuslice_ledger::procfs::pid_ns_of_pid(pid),
    })
}

/// Whether `pid` (uid `uid`) may use the operator commands: root, or a member of the
/// operator group (its primary or supplementary groups, as `/proc` says).
fn is_operator(server: &Server, pid: u32, uid: u32) -> bool {
    uid == 0 || (server.operator_group.gid).is_some_and(|gid| crate::procfs::in_group(pid, gid))
}

/// The reply to one request, with the descriptors it carries.
type Answer = (Reply, Vec<OwnedFd>);

fn answer(
    server: &Server,
    req: Request,
    fds: &[OwnedFd],
    pid: u32,
    uid: u32,
) -> Result<Answer, Refusal> {
    let ledger = &server.policy;
    // An admitted process's exported VMM allocations (`crate::shared`): its own record only.
    let admitted = || -> Result<ProcHandle, RequestError> {
        let peer = peer_of(pid, uid)?;
        let slot = ledger
            .admitted_slot(peer.host_pid, peer.start_time)
            .ok_or(RequestError::NotAdmitted("share its memory"))?;
        Ok(ProcHandle { slot })
    };
    let operator = || -> Result<(), RequestError> {
        if is_operator(server, pid, uid) {
            return Ok(());
        }
        Err(RequestError::NotOperator {
            uid,
            group: server.operator_group.name.clone(),
        })
    };
    let reply: Reply = match req {
        Request::Admit(req) => return admit(server, req, pid, uid),
        Request::Ping(Ping) => Pong {
            pid: std::process::id(),
        }
        .into(),
        Request::View(v) => return Ok((Viewed.into(), vec![view(server, v, uid)?])),
        Request::Release(r) => release(server, &r, pid, uid)?.into(),
        Request::ShareExport(r) => crate::shared::export(ledger, admitted()?, &r, fds)?.into(),
        Request::ShareImport(ShareImport) => {
            crate::shared::import(ledger, admitted()?, fds)?.into()
        }
        Request::ShareLeave(r) => crate::shared::leave(ledger, admitted()?, &r)?.into(),
        Request::ShareLetGo(r) => crate::shared::let_go(ledger, admitted()?, &r)?.into(),
        Request::SliceCreate(c) => {
            operator()?;
            slice_create(ledger, c)?.into()
        }
        Request::SliceRemove(r) => {
            operator()?;
            Done {
                records: ledger.remove_slice(&r.name).map_err(RequestError::from)?,
            }
            .into()
        }
        Request::SliceSet(c) => {
            operator()?;
            slice_set(ledger, c)?.into()
        }
        Request::SlicePriority(p) => {
            operator()?;
            Done {
                records: ledger
                    .set_slice_priority(&p.name, p.priority)
                    .map_err(RequestError::from)?,
            }
            .into()
        }
    };
    Ok((reply, vec![]))
}

/// The slow path of an admitted process the driver refused (the device is full): memory from
/// its own slice's balloon, never another's.
fn release(
    server: &Server,
    r: &protocol::Release,
    pid: u32,
    uid: u32,
) -> Result<Released, RequestError> {
    let Some(b) = &server.balloons else {
        return Ok(Released { bytes: 0 });
    };
    let peer = peer_of(pid, uid)?;
    let bytes = b.release_for(
        &server.policy,
        peer.host_pid,
        peer.start_time,
        &r.device,
        r.bytes,
    )?;
    Ok(Released { bytes })
}

/// The optional join secret of an operator request (`gpuslice_ledger::secret`), never logged.
fn secret_of(v: Option<&str>) -> Result<Option<Secret>, RequestError> {
    Ok(v.map(|v| Secret::parse("the request's secret", v))
        .transpose()?)
}

fn slice_create(ledger: &Ledger, c: SliceCreate) -> Result<Done, RequestError> {
    let secret = secret_of(c.secret.as_deref())?;
    let made = ledger.create_operator_slice_with_secret(
        &OperatorSlice {
            name: c.name.clone(),
            device: c.device.clone(),
            memory: c.memory,
            compute_share: c.share,
            compute_cap: c.cap,
            claim: c.claim,
        },
        secret.as_ref(),
    );
    let records = made.and_then(|_| match c.owner {
        Some(uid) => ledger.set_slice_owner(&c.name, &c.device, uid),
        None => Ok(1),
    })?;
    Ok(Done { records })
}

fn slice_set(ledger: &Ledger, c: SliceSet) -> Result<Done, RequestError> {
    if c.class
        .is_some_and(|c| c != gpuslice_sched::CLASS_NORMAL && c != gpuslice_sched::CLASS_LATENCY)
    {
        return Err(RequestError::NotAClass);
    }
    let records = ledger.set_slice(
        &c.name,
        &gpuslice_ledger::SliceChange {
            memory: c.memory,
            compute_share: c.share,
            compute_cap: c.cap,
            class: c.class,
        },
    )?;
    Ok(Done { records })
}

/// A read-only descriptor of slice `v.slice`'s region, for the slice's own uid or root.
fn view(server: &Server, v: protocol::View, uid: u32) -> Result<OwnedFd, RequestError> {
    let s = server
        .policy
        .slices()
        .get(v.slice)
        .filter(|s| s.state.load(SeqCst) == STATE_ACTIVE)
        .ok_or(RequestError::NoSuchSlice)?;
    let owner = s.owner_uid.load(SeqCst);
    if uid != 0 && owner != uid {
        return Err(RequestError::NotYours {
            slice: v.slice,
            uid,
        });
    }
    let r = server
        .regions
        .get(v.slice as u32)
        .ok_or(RequestError::NoRegion)?;
    // A read-only reopen: the receiver can map it, never write it.
    let f =
        std::fs::File::open(format!("/proc/self/fd/{}", r.fd())).map_err(RequestError::Reopen)?;
    Ok(OwnedFd::from(f))
}

/// A new reservation (a quota slice this process would create) must fit the device as it
/// physically is, not only the ledger's sums (`crate::physical`): refused with what it asked,
/// what the device can take and whose memory is outside gpuslice. Joining an existing slice
/// takes nothing new (its reservation was checked, and the balloons hold it).
fn physically_fits(server: &Server, asks: &[DeviceAsk], uid: u32) -> Result<(), Refusal> {
    let Some(nvml) = &server.nvml else {
        return Ok(());
    };
    for ask in asks {
        let Some(want) = ask.req.memory else {
            continue;
        };
        let ledger = &server.policy;
        let Some(dev) = ledger.find_device(&ask.uuid) else {
            continue;
        };
        if ledger.joins_existing(ask.req.name.as_deref(), dev, uid) {
            continue;
        }
        let balloons = server.balloons.is_some();
        let Some(room) = crate::physical::room(
            ledger,
            server.regions.as_ref(),
            nvml,
            balloons,
            dev,
            &ask.uuid,
        ) else {
            continue;
        };
        if want > room.available() {
            return Err(Refusal::asked(format!(
                "admission: slice refused: {}: requested {}, available {} on {} as the device \
                 physically is ({} free by NVML, {} of it other slices' reservations not held \
                 yet){}",
                ask.req.memory_setting,
                gpuslice_ledger::human_bytes(want),
                gpuslice_ledger::human_bytes(room.available()),
                ask.uuid,
                gpuslice_ledger::human_bytes(room.free),
                gpuslice_ledger::human_bytes(room.owed),
                room.outside_text()
            )));
        }
    }
    Ok(())
}

fn admit(server: &Server, req: AdmitRequest, pid: u32, uid: u32) -> Result<Answer, Refusal> {
    let peer = peer_of(pid, uid)?;
    if let Some(n) = &req.slice {
        gpuslice_quantity::check_slice_name("GPUSLICE_SLICE", n)
            .map_err(|e| Refusal::other(e.to_string()))?;
    }
    if req.devices.len() > gpuslice_ledger::MAX_DEVICES {
        return Err(Refusal::new(
            Why::BadRequest,
            "bad request: too many devices",
        ));
    }
    let asks: Vec<DeviceAsk> = req
        .devices
        .iter()
        .map(|d| DeviceAsk {
            uuid: d.uuid.clone(),
            // The request, as the policy joins it.
            req: SliceRequest {
                name: req.slice.clone(),
                memory: d.memory,
                compute_share: d.compute_share,
                compute_cap: d.compute_cap,
                memory_setting: d.memory_setting.clone(),
                compute_setting: d.compute_setting.clone(),
            },
        })
        .collect();
    let name = &req.slice;
    let ledger = &server.policy;
    physically_fits(server, &asks, peer.uid)?;
    let a = ledger
        .admit_with_secret(
            &peer,
            name.as_deref().unwrap_or(""),
            &asks,
            &server.limits,
            req.secret.as_deref(),
        )
        .map_err(|e| match e {
            LedgerError::DoesNotFit(a) => Refusal::asked(format!("admission: slice refused: {a}")),
            e if e.refuses_the_request() => Refusal::asked(e.to_string()),
            e => Refusal::other(e.to_string()),
        })?;
    // GPUSLICE_PRIORITY: the class of the process's own slices (an operator's slice keeps the
    // class the operator gave it). Priority orders turns within the guarantees (the latency
    // lead is bounded), so it is the tenant's to choose for its own slice.
    if let Some(class) = req.priority {
        for d in &a.devices {
            ledger.set_requested_class(d.slice, class);
        }
    }
    // The room each slice reserved for a context goes to this process, which creates its
    // contexts next (docs/security.md, "Reserved memory is held").
    if let Some(b) = &server.balloons {
        for d in &a.devices {
            b.admitted(ledger, d.slice);
        }
    }
    let mut reply = AdmitReply {
        slot: a.slot,
        ..AdmitReply::default()
    };
    let mut fds = vec![];
    for d in &a.devices {
        let r = server
            .regions
            .get_or_make(ledger, d.key)
            .map_err(|e| Refusal::other(format!("cannot make the slice's region: {e}")))?;
        // A slot starts clean in its region (a previous holder's words were reaped).
        r.reset_slot(a.slot);
        // SAFETY: dup of a descriptor we own; the duplicate is sent and closed after.
        let dup = unsafe { libc::fcntl(r.fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(Refusal::other("cannot pass the slice's region"));
        }
        // SAFETY: just duplicated, ours.
        fds.push(unsafe { OwnedFd::from_raw_fd(dup) });
        reply.devices.push(GrantedDevice {
            uuid: d.uuid.clone(),
            device: d.device,
            slice: d.slice,
            memory_limit: d.memory_limit,
            allowance: d.allowance,
        });
        reply.warnings.extend(d.warnings.iter().cloned());
    }
    Ok((reply.into(), fds))
}
