//! Kubernetes quantities as the API server writes them (`4Gi`, `250`, `1k`, `1.5G`, `100m`,
//! `1e3`), for the DRA plugin's `consumedCapacity` and its size flags: read exactly, with the
//! one unit table ([`kubernetes_unit`]) plus what only Kubernetes writes (the sub-units `n` `u`
//! `m`, exponents), and bytes written back as the API server canonicalizes them.

use crate::{err, kubernetes_unit, parse_decimal, QuantityError, BINARY_UNITS};

/// Accepted forms of a Kubernetes quantity, for error messages.
pub const KUBERNETES_FORMS: &str = "a Kubernetes quantity: a number with an optional suffix Ki Mi \
                                    Gi Ti Pi Ei, n u m k M G T P E, or eN (4Gi, 1.5G, 100m, 1e3)";

/// The value of the Kubernetes quantity `value`, rounded up to an integer: the API server may
/// canonicalize `1000` to `1k` and a byte count to `4Gi`, and a fraction (`100m`) is rounded up
/// so that a request is never shrunk. `variable` names the source for errors.
pub fn parse_kubernetes(variable: &str, value: &str) -> Result<u128, QuantityError> {
    let e = |r: String| err(variable, value, r, KUBERNETES_FORMS);
    let s = value.trim();
    // The grammar's optional `+`; a `-` is never a capacity.
    let s = s.strip_prefix('+').unwrap_or(s);
    let (num, suffix) = s.split_at(
        s.find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len()),
    );
    if num.is_empty() {
        return Err(e(if s.starts_with('-') {
            "negative values are not quantities".into()
        } else {
            "no number".into()
        }));
    }
    let d = parse_decimal(num).map_err(e)?;
    // value = mantissa * multiplier / 10^(scale + sub), rounded up.
    let (multiplier, sub): (u128, u32) = match suffix {
        _ if kubernetes_unit(suffix).is_some() => (kubernetes_unit(suffix).unwrap_or(1), 0),
        "n" => (1, 9),
        "u" => (1, 6),
        "m" => (1, 3),
        x if x.starts_with(['e', 'E']) => {
            let exp: i32 = x[1..]
                .parse()
                .map_err(|_| e(format!("bad exponent {x:?}")))?;
            match exp {
                31.. => return Err(e("too large".into())),
                0.. => (10u128.pow(exp.unsigned_abs()), 0),
                _ => (1, exp.unsigned_abs()),
            }
        }
        _ => return Err(e(format!("unknown suffix {suffix:?}"))),
    };
    let pow = d.scale + sub;
    if pow > 38 {
        return Err(e("too many decimal places".into()));
    }
    let n = d
        .mantissa
        .checked_mul(multiplier)
        .ok_or_else(|| e("too large".into()))?;
    Ok(n.div_ceil(10u128.pow(pow)))
}

/// Bytes as the API server writes them: in the largest binary unit that divides them exactly
/// (`4Gi`, `1536Mi`, `12345`), which [`parse_kubernetes`] reads back unchanged.
pub fn kubernetes_bytes(b: u64) -> String {
    for (unit, power) in BINARY_UNITS.iter().rev() {
        let shift = 10 * power;
        if b != 0 && b.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<u128, QuantityError> {
        parse_kubernetes("consumedCapacity memory", s)
    }

    #[test]
    fn reads_what_the_api_server_writes() {
        assert_eq!(parse("4Gi").unwrap(), 4 << 30);
        assert_eq!(parse("4294967296").unwrap(), 4 << 30);
        assert_eq!(parse("250").unwrap(), 250);
        assert_eq!(parse("1k").unwrap(), 1000);
        assert_eq!(parse("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse("4G").unwrap(), 4_000_000_000);
        assert_eq!(parse("1e3").unwrap(), 1000);
        assert_eq!(parse("100m").unwrap(), 1); // a fraction rounds up
        assert_eq!(parse("1500m").unwrap(), 2);
        assert_eq!(parse("2000u").unwrap(), 1);
        assert_eq!(parse("7n").unwrap(), 1);
        assert_eq!(parse("1e-3").unwrap(), 1);
        assert_eq!(parse("+2").unwrap(), 2);
        assert_eq!(parse(" 2Ki ").unwrap(), 2048);
        assert_eq!(parse("0").unwrap(), 0);
        assert_eq!(parse("0m").unwrap(), 0);
        assert_eq!(parse("2Ei").unwrap(), 2 << 60);
        assert_eq!(parse("1E").unwrap(), 1_000_000_000_000_000_000);
        for bad in [
            "", "Gi", "-1", "4XB", "1.2.3", "4 Gi", "1e99", "1K", "4GiB", ".", "++1", "1e", "e3",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_name_the_source_the_value_and_the_forms() {
        let m = parse("4XB").unwrap_err().to_string();
        assert!(
            m.starts_with("consumedCapacity memory=\"4XB\"")
                && m.contains("unknown suffix \"XB\"")
                && m.contains("Ki Mi Gi"),
            "{m}"
        );
        let m = parse("-1").unwrap_err().to_string();
        assert!(m.contains("negative"), "{m}");
    }

    #[test]
    fn writes_binary_units() {
        for (n, written) in [
            (4 << 30, "4Gi"),
            (1536 << 20, "1536Mi"),
            (12345, "12345"),
            (0, "0"),
            (1 << 63, "8Ei"),
        ] {
            assert_eq!(kubernetes_bytes(n), written, "{n}");
        }
        assert_eq!(parse(&kubernetes_bytes(16 << 30)).unwrap(), 16 << 30);
    }
}
