//! Kubernetes quantities (`4Gi`, `250`, `1k`, `1.5G`, `100m`, `1e3`), as the API server writes
//! them in `consumedCapacity`, read exactly into integers, and written back in binary units for
//! bytes.

/// The value of quantity `s` rounded up to an integer (the API server may canonicalize `1000` to
/// `1k` and a byte count to `4Gi`; a fraction is rounded up, so a request is never shrunk).
/// `Err` names what is wrong.
pub fn parse(s: &str) -> Result<u128, QuantityError> {
    let t = s.trim();
    let bad = |why: &'static str| QuantityError {
        input: s.to_string(),
        why,
    };
    let (num, suffix) = t.split_at(
        t.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
            .unwrap_or(t.len()),
    );
    let num = num.strip_prefix('+').unwrap_or(num);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(bad("expected a number"));
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    // value = digits / 10^frac.len() * multiplier
    let digits: u128 = format!("{int}{frac}")
        .parse()
        .map_err(|_| bad("the number is too large"))?;
    // The unit table is the settings grammar's (`gpuslice_quantity::kubernetes_unit`); only
    // the sub-units and exponents, which sizes never take, are read here.
    let unit = gpuslice_quantity::kubernetes_unit(suffix);
    let (mul_num, mul_den_pow10): (u128, i32) = match suffix {
        _ if unit.is_some() => (unit.unwrap_or(1), 0),
        "n" => (1, 9),
        "u" => (1, 6),
        "m" => (1, 3),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| bad("bad exponent"))?;
            if exp > 30 {
                return Err(bad("the number is too large"));
            }
            if exp >= 0 {
                (10u128.pow(exp as u32), 0)
            } else {
                (1, -exp)
            }
        }
        _ => {
            return Err(bad(
                "unknown suffix (Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or eN)",
            ))
        }
    };
    let den_pow = frac.len() as i32 + mul_den_pow10;
    if den_pow > 38 {
        return Err(bad("too many decimal places"));
    }
    let den = 10u128.pow(den_pow as u32);
    let n = digits
        .checked_mul(mul_num)
        .ok_or_else(|| bad("the number is too large"))?;
    Ok(n.div_ceil(den))
}

/// A string that is not a quantity, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantityError {
    /// The string.
    pub input: String,
    /// What is wrong (`unknown suffix (Ki Mi Gi …)`).
    pub why: &'static str,
}

impl std::fmt::Display for QuantityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "quantity {:?}: {}", self.input, self.why)
    }
}

impl std::error::Error for QuantityError {}

/// Bytes as a quantity: the largest binary unit that divides them exactly (`4Gi`, `1536Mi`,
/// `12345`).
pub fn bytes(b: u64) -> String {
    for (unit, power) in gpuslice_quantity::BINARY_UNITS.iter().rev() {
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
        assert_eq!(parse("0").unwrap(), 0);
        assert_eq!(parse("2Ei").unwrap(), 2 << 60);
        assert_eq!(parse("1E").unwrap(), 1_000_000_000_000_000_000);
        for bad in ["", "Gi", "-1", "4XB", "1.2.3", "4 Gi", "1e99", "1K", "4GiB"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn writes_binary_units() {
        for (n, written) in [
            (4 << 30, "4Gi"),
            (1536 << 20, "1536Mi"),
            (12345, "12345"),
            (0, "0"),
        ] {
            assert_eq!(bytes(n), written, "{n}");
        }
        assert_eq!(parse(&bytes(16 << 30)).unwrap(), 16 << 30);
    }
}
