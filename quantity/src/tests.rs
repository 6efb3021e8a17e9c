use super::*;

/// The message of the error `r` must be (the test fails on `Ok`).
fn refused<T: std::fmt::Debug>(r: Result<T, impl std::fmt::Display>) -> String {
    match r {
        Ok(v) => panic!("accepted: {v:?}"),
        Err(e) => e.to_string(),
    }
}

fn bytes(v: &str) -> u64 {
    match parse_size("GPUSLICE_MEMORY", v).unwrap() {
        Size::Bytes(b) => b,
        p => panic!("{v} gave {p:?}"),
    }
}

#[test]
fn slice_names() {
    for ok in ["team-a.job_1", "ns/team:a", &"x".repeat(63), "a"] {
        assert!(check_slice_name("GPUSLICE_SLICE", ok).is_ok(), "{ok}");
        assert!(valid_slice_name(ok) && storable_name(ok));
    }
    for bad in ["", "a b", "a,b", "é", "pid-42", &"x".repeat(64)] {
        let e = check_slice_name("--slice", bad).unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("--slice=") && m.contains("accepted"), "{m}");
        assert!(!valid_slice_name(bad));
    }
    assert!(storable_name("pid-42"));
}

#[test]
fn sizes() {
    assert_eq!(bytes("4Gi"), 4 << 30);
    assert_eq!(bytes("4096Mi"), 4 << 30);
    assert_eq!(bytes("4G"), 4_000_000_000);
    assert_eq!(bytes("4GiB"), 4 << 30);
    assert_eq!(bytes("4GB"), 4_000_000_000);
    assert_eq!(bytes("4294967296"), 4 << 30);
    assert_eq!(bytes("1.5Gi"), 3 << 29);
    assert_eq!(bytes("0"), 0);
    assert_eq!(bytes(" 1Ki "), 1024);
    assert_eq!(bytes("15Ei"), 15 << 60);
    assert_eq!(parse_size("V", "25%").unwrap(), Size::Percent(250_000));
    assert_eq!(parse_size("V", "12.5%").unwrap(), Size::Percent(125_000));
    assert_eq!(Size::Percent(250_000).resolve(16 << 30), 4 << 30);
}

#[test]
fn bad_sizes_are_errors() {
    for v in [
        "12XB",
        "-1",
        "1.5",
        "",
        "  ",
        "4 Gi",
        "4gi",
        "4g",
        "4m",
        "1e9",
        "0x10",
        "Gi",
        "%",
        "0%",
        "101%",
        "18446744073709551616",
        "16Ei",
        "99999999999999999999999999999999999999999",
        "1..5Gi",
        "4Gi,",
        "--1",
    ] {
        let r = parse_size("GPUSLICE_MEMORY", v);
        assert!(r.is_err(), "{v:?} gave {r:?}");
        let msg = refused(r);
        assert!(
            msg.contains("GPUSLICE_MEMORY") && msg.contains("accepted"),
            "{msg}"
        );
    }
    let msg = refused(parse_size("GPUSLICE_MEMORY", "12XB"));
    assert!(
        msg.contains("12XB") && msg.contains("unknown unit"),
        "{msg}"
    );
}

#[test]
fn zero_is_never_a_quota() {
    for v in ["0", "0Gi", "0.0Mi", "0B", "0=0", "0=1Gi,1=0", "0%"] {
        let msg = refused(parse_size_per_device("GPUSLICE_MEMORY", v));
        assert!(
            msg.contains("GPUSLICE_MEMORY") && msg.contains("0"),
            "{v}: {msg}"
        );
    }
    assert!(refused(parse_quota("--memory", "0")).contains("quota of 0 bytes"));
    assert_eq!(parse_quota("--memory", "1").unwrap(), Size::Bytes(1));
    // A size that is not a quota (an allocation's) may still be 0.
    assert_eq!(parse_size("--alloc", "0").unwrap(), Size::Bytes(0));
}

#[test]
fn per_device() {
    let p = parse_size_per_device("GPUSLICE_MEMORY", "0=4Gi,1=8Gi").unwrap();
    assert_eq!(p.get(0), Some(Size::Bytes(4 << 30)));
    assert_eq!(p.get(1), Some(Size::Bytes(8 << 30)));
    assert_eq!(p.get(2), None);
    assert_eq!(
        parse_size_per_device("V", "2Gi").unwrap().get(7),
        Some(Size::Bytes(2 << 30))
    );
    for v in [
        "0=4Gi,0=8Gi",
        "0=4Gi,8Gi",
        "x=1Gi",
        "0=12XB",
        "-1=1Gi",
        "0=",
        "0=4Gi,,1=1Gi",
    ] {
        assert!(parse_size_per_device("V", v).is_err(), "{v}");
    }
}

#[test]
fn hami_forms() {
    assert_eq!(
        parse_hami_size("CUDA_DEVICE_MEMORY_LIMIT", "1g").unwrap(),
        1 << 30
    );
    assert_eq!(parse_hami_size("X", "1G").unwrap(), 1 << 30);
    assert_eq!(parse_hami_size("X", "512m").unwrap(), 512 << 20);
    assert_eq!(parse_hami_size("X", "64k").unwrap(), 64 << 10);
    assert_eq!(parse_hami_size("X", "1048576").unwrap(), 1 << 20);
    for v in [
        "12XB",
        "-1",
        "0",
        "0g",
        "",
        "1.5g",
        "0x10",
        "010",
        "1gb",
        "1Gi",
        "99999999999999999999g",
        "17179869184g",
    ] {
        assert!(
            parse_hami_size("CUDA_DEVICE_MEMORY_LIMIT", v).is_err(),
            "{v}"
        );
    }
    assert_eq!(
        parse_hami_sm_limit("S", "30").unwrap(),
        Cap::at(Share::from_ppm(300_000))
    );
    assert_eq!(parse_hami_sm_limit("S", "0").unwrap(), Cap::NONE);
    for v in ["101", "-5", "0.5", "", "50%"] {
        assert!(
            parse_hami_sm_limit("CUDA_DEVICE_SM_LIMIT", v).is_err(),
            "{v}"
        );
    }
}
