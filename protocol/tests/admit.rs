//! The admission request and reply on the wire: they survive it, and every malformed field is
//! refused with its reason.

use gpuslice_protocol::*;
use gpuslice_quantity::{Cap, Share};

fn request() -> AdmitRequest {
    AdmitRequest {
        slice: Some("team".into()),
        secret: Some("s".repeat(32)),
        priority: Some(1),
        devices: vec![
            DeviceRequest {
                uuid: "GPU-1".into(),
                memory: Some(1 << 30),
                compute_share: Share::from_ppm(250_000),
                compute_cap: Cap::NONE,
                memory_setting: "GPUSLICE_MEMORY".into(),
                compute_setting: "GPUSLICE_COMPUTE".into(),
            },
            DeviceRequest {
                uuid: "GPU-2".into(),
                memory: None,
                compute_share: Share::NONE,
                compute_cap: Cap::from_ppm(500_000),
                memory_setting: "CUDA_DEVICE_MEMORY_LIMIT_1".into(),
                compute_setting: "GPUSLICE_COMPUTE".into(),
            },
        ],
    }
}

#[test]
fn a_request_survives_the_wire() {
    for r in [request(), AdmitRequest::default()] {
        let m = Message::decode(&Request::from(r.clone()).encode().encode()).unwrap();
        assert_eq!(Request::decode(&m), Ok(Request::Admit(r)));
    }
}

#[test]
fn a_bad_request_is_refused_with_its_reason() {
    for (line, why) in [
        ("GPU-1\t-\t0\t1000000\tM", "6 fields"),
        ("GPU-1\t0\t0\t1000000\tM\tC", "out of range"),
        ("GPU-1\t-\t1000001\t1000000\tM\tC", "out of range"),
        ("GPU-1\t-\t0\t2000000\tM\tC", "out of range"),
        ("GPU-1\tx\t0\t1000000\tM\tC", "memory"),
        ("GPU-1\t-\t-1\t1000000\tM\tC", "share"),
    ] {
        let mut m = Message::new("op", "admit");
        m.push("dev", line);
        let e = Request::decode(&m).unwrap_err().to_string();
        assert!(e.contains(why), "{line:?}: {e}");
    }
    let mut m = Request::from(request()).encode();
    m.push("dev", "GPU-1\t-\t0\t1000000\tM\tC");
    assert_eq!(
        Request::decode(&m).unwrap_err(),
        BadMessage::Twice("GPU-1".into())
    );
}

#[test]
fn too_many_devices_are_refused() {
    let mut m = Message::new("op", "admit");
    for i in 0..=MAX_REQUEST_DEVICES {
        m.push("dev", &format!("GPU-{i}\t-\t0\t1000000\tM\tC"));
    }
    assert_eq!(Request::decode(&m).unwrap_err(), BadMessage::TooManyDevices);
}

#[test]
fn a_reply_and_a_refusal_survive_the_wire() {
    let reply = AdmitReply {
        slot: 7,
        devices: vec![
            GrantedDevice {
                uuid: "GPU-1".into(),
                device: 0,
                slice: 3,
                memory_limit: Some(1 << 30),
                allowance: None,
            },
            GrantedDevice {
                uuid: "GPU-2".into(),
                device: 1,
                slice: 4,
                memory_limit: None,
                allowance: Some(2),
            },
        ],
        warnings: vec!["the slice keeps its own values".into()],
    };
    let m = Message::decode(&Reply::from(reply.clone()).encode().encode()).unwrap();
    assert_eq!(Reply::decode(Op::Admit, &m), Ok(Ok(Reply::Admitted(reply))));
    for refusal in [
        Refusal::asked("admission: slice refused: no room"),
        Refusal::other("cannot read /proc/1"),
    ] {
        let m = Message::decode(&refusal.encode().encode()).unwrap();
        assert_eq!(Reply::decode(Op::Admit, &m), Ok(Err(refusal)));
    }
    let mut bad = Message::new("ok", "admit");
    bad.push("slot", "1").push("dev", "GPU-1\t0\t0\t-");
    assert_eq!(
        Reply::decode(Op::Admit, &bad).unwrap_err(),
        BadMessage::DevLine(5)
    );
}
