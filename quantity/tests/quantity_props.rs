//! Property tests of the size and fraction parsers: random input never panics, and never comes
//! back as a value the input did not spell (in particular never a silent "unlimited").

use gpuslice_quantity::{
    kubernetes_bytes, parse_fraction, parse_hami_size, parse_kubernetes, parse_size,
    parse_size_per_device, Size,
};
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

/// The byte multiplier of each suffix, written out as the numbers docs/configuration.md
/// promises (no arithmetic, no table shared with the parser, whose `unit_of` builds its
/// multipliers from `BINARY_UNITS`/`DECIMAL_UNITS` powers).
const UNITS: [(&str, u128); 27] = [
    ("", 1),
    ("B", 1),
    ("k", 1_000),
    ("K", 1_000),
    ("kB", 1_000),
    ("KB", 1_000),
    ("M", 1_000_000),
    ("MB", 1_000_000),
    ("G", 1_000_000_000),
    ("GB", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("TB", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("PB", 1_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000),
    ("EB", 1_000_000_000_000_000_000),
    ("Ki", 1_024),
    ("KiB", 1_024),
    ("Mi", 1_048_576),
    ("MiB", 1_048_576),
    ("Gi", 1_073_741_824),
    ("GiB", 1_073_741_824),
    ("Ti", 1_099_511_627_776),
    ("TiB", 1_099_511_627_776),
    ("Pi", 1_125_899_906_842_624),
    ("PiB", 1_125_899_906_842_624),
    ("Ei", 1_152_921_504_606_846_976),
];

fn unit_of(s: &str) -> Option<u128> {
    match s {
        "EiB" => Some(1_152_921_504_606_846_976),
        _ => UNITS.iter().find(|(u, _)| *u == s).map(|(_, m)| *m),
    }
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
            prop_assert!(p.ppm() <= 1_000_000 && !s.contains('-'), "{s:?} gave {p:?}");
        }
        let _ = parse_size_per_device("GPUSLICE_MEMORY", &s);
        // A Kubernetes quantity: never negative, and an integer one means what `parse_size`
        // reads (the unit table is one; sizes only add `B` and `K`).
        match parse_kubernetes("consumedCapacity memory", &s) {
            Ok(v) => {
                prop_assert!(!s.contains('-') || s.contains('e') || s.contains('E'), "{s:?} gave {v}");
                if let Some(b) = oracle(&s).filter(|_| !s.contains(['B', 'K'])) {
                    prop_assert_eq!(v, b as u128, "{:?}", s);
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("accepted"), "{}", e),
        }
    }

    #[test]
    fn kubernetes_bytes_read_back(b in any::<u64>()) {
        prop_assert_eq!(parse_kubernetes("V", &kubernetes_bytes(b)).unwrap(), b as u128);
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
