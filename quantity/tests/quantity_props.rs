//! Property tests of the size and fraction parsers: random input never panics, and never comes
//! back as a value the input did not spell (in particular never a silent "unlimited").

use gpuslice_quantity::{parse_fraction, parse_hami_size, parse_size, parse_size_per_device, Size};
use proptest::prelude::*;

/// Strings that are often close to valid: digits, dots, units, signs, junk.
fn near_miss() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            "[0-9]{1,25}",
            Just(".".to_string()),
            Just("-".to_string()),
            Just("%".to_string()),
            Just(",".to_string()),
            Just("=".to_string()),
            Just(" ".to_string()),
            "(Ki|Mi|Gi|Ti|Pi|Ei|KiB|GiB|k|K|M|G|T|E|GB|B|g|m|XB|e|x|0x)",
            any::<char>().prop_map(|c| c.to_string()),
        ],
        0..6,
    )
    .prop_map(|v| v.concat())
}

fn unit_of(s: &str) -> Option<u128> {
    let k = 1000u128;
    let ki = 1024u128;
    Some(match s {
        "" | "B" => 1,
        "k" | "K" | "kB" | "KB" => k,
        "M" | "MB" => k.pow(2),
        "G" | "GB" => k.pow(3),
        "T" | "TB" => k.pow(4),
        "P" | "PB" => k.pow(5),
        "E" | "EB" => k.pow(6),
        "Ki" | "KiB" => ki,
        "Mi" | "MiB" => ki.pow(2),
        "Gi" | "GiB" => ki.pow(3),
        "Ti" | "TiB" => ki.pow(4),
        "Pi" | "PiB" => ki.pow(5),
        "Ei" | "EiB" => ki.pow(6),
        _ => return None,
    })
}

/// An independent oracle for integer sizes: `digits unit`.
fn oracle(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() || num.len() > 30 {
        return None;
    }
    let n: u128 = num.parse().ok()?;
    u64::try_from(n.checked_mul(unit_of(unit)?)?).ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn random_strings_never_panic_nor_mean_unlimited(s in prop_oneof![near_miss(), any::<String>()]) {
        match parse_size("GPUSLICE_MEMORY", &s) {
            Ok(Size::Bytes(b)) => {
                prop_assert!(!s.contains('-'), "{s:?} gave {b}");
                if !s.contains('.') {
                    prop_assert_eq!(Some(b), oracle(&s), "{:?}", s);
                }
            }
            Ok(Size::Percent(p)) => {
                prop_assert!(s.trim().ends_with('%') && p > 0 && p <= 1_000_000, "{s:?} gave {p}");
            }
            Err(e) => {
                let m = e.to_string();
                prop_assert!(m.contains("GPUSLICE_MEMORY") && m.contains("accepted"), "{}", m);
                if !s.contains('.') && !s.trim().ends_with('%') {
                    prop_assert_eq!(oracle(&s), None, "{:?} rejected but valid", s);
                }
            }
        }
        if let Ok(b) = parse_hami_size("CUDA_DEVICE_MEMORY_LIMIT", &s) {
            prop_assert!(b > 0 && !s.contains('-') && !s.contains('.'), "{s:?} gave {b}");
        }
        if let Ok(p) = parse_fraction("GPUSLICE_COMPUTE", &s) {
            prop_assert!(p <= 1_000_000 && !s.contains('-'), "{s:?} gave {p}");
        }
        let _ = parse_size_per_device("GPUSLICE_MEMORY", &s);
    }

    #[test]
    fn integer_sizes_round_trip(n in 0u64..(1 << 40), unit in "(|B|Ki|Mi|Gi|KiB|MiB|GiB|k|M|G|GB)") {
        let want = (n as u128) * unit_of(&unit).unwrap();
        let got = parse_size("V", &format!("{n}{unit}"));
        match u64::try_from(want) {
            Ok(w) => prop_assert_eq!(got.unwrap(), Size::Bytes(w)),
            Err(_) => prop_assert!(got.is_err()),
        }
    }
}
