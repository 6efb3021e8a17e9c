//! A share of one device's compute time, as one type from the edge that reads it to the
//! scheduler that enforces it: a guarantee ([`Share`]) or a ceiling ([`Cap`]), each with one
//! "none" ([`Share::NONE`]: nothing guaranteed; [`Cap::NONE`]: uncapped). Both hold parts per
//! million ([`PPM`] is the whole device), the unit the ledger stores; [`Share::ppm`] and
//! [`Cap::ppm`] are that stored form, and nothing past the edges reads a bare number.
//!
//! The parsers of the settings that give them (`GPUSLICE_COMPUTE`, `GPUSLICE_COMPUTE_CAP`,
//! `--compute`, `--compute-cap`, `CUDA_DEVICE_SM_LIMIT`) and the one rule between the two
//! ([`check_cap_not_below_share`]) are here too.

use crate::{
    err, form, parse_decimal, parse_per_device, percent_ppm, Form, PerDevice, QuantityError,
    FRACTION_FORMS, HAMI_SM_FORMS, PPM,
};

/// A guaranteed share of one device's compute time, in parts per million (at most [`PPM`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Share(u32);

impl Share {
    /// Nothing guaranteed (a slice that only borrows idle time).
    pub const NONE: Share = Share(0);
    /// The whole device.
    pub const WHOLE: Share = Share(PPM);

    /// `ppm` parts per million of the device; more than [`PPM`] is the whole device.
    pub const fn from_ppm(ppm: u32) -> Share {
        Share(if ppm > PPM { PPM } else { ppm })
    }

    /// Parts per million (the ledger's stored form).
    pub const fn ppm(self) -> u32 {
        self.0
    }

    /// Whether nothing is guaranteed.
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }

    /// As a fraction of the device, 0.0 to 1.0 (for people and JSON).
    pub fn fraction(self) -> f64 {
        self.0 as f64 / PPM as f64
    }
}

/// A ceiling on a slice's share of one device, or none ([`Cap::NONE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cap(u32);

impl Cap {
    /// Uncapped.
    pub const NONE: Cap = Cap(PPM);

    /// A ceiling at `share`; a ceiling of the whole device, or of nothing (which no setting
    /// gives: [`parse_cap`] refuses 0), caps nothing.
    pub const fn at(share: Share) -> Cap {
        Cap::from_ppm(share.0)
    }

    /// The stored form back: [`PPM`] or more, or 0, is uncapped.
    pub const fn from_ppm(ppm: u32) -> Cap {
        if ppm == 0 || ppm >= PPM {
            Cap::NONE
        } else {
            Cap(ppm)
        }
    }

    /// Parts per million, [`PPM`] when uncapped (the ledger's stored form).
    pub const fn ppm(self) -> u32 {
        self.0
    }

    /// The ceiling, `None` when uncapped.
    pub const fn limit(self) -> Option<Share> {
        if self.0 >= PPM {
            None
        } else {
            Some(Share(self.0))
        }
    }

    /// Whether it caps nothing.
    pub const fn is_none(self) -> bool {
        self.0 >= PPM
    }

    /// As a fraction of the device, 1.0 when uncapped (for people and JSON).
    pub fn fraction(self) -> f64 {
        self.0 as f64 / PPM as f64
    }
}

impl Default for Cap {
    fn default() -> Cap {
        Cap::NONE
    }
}

/// Accepted compute caps.
pub const CAP_FORMS: &str =
    "a fraction above 0 and at most 1 (0.3) or a percentage (30%); per device: 0=0.5,1=25%";
/// What a cap must be relative to the share it caps.
pub const CAP_VS_SHARE: &str = "a cap at or above the guaranteed compute share (or no cap)";

/// Parse a compute fraction (`0.25`, `25%`, `1`, `0` for none) into a [`Share`].
pub fn parse_fraction(variable: &str, value: &str) -> Result<Share, QuantityError> {
    let e = |r: String| err(variable, value, r, FRACTION_FORMS);
    let s = match form(value).map_err(e)? {
        Form::Percent(body) => return percent_ppm(body, true).map(Share).map_err(e),
        Form::Plain(s) => s,
    };
    if s.starts_with('-') {
        return Err(e("negative".into()));
    }
    let d = parse_decimal(s).map_err(e)?;
    let num = d
        .mantissa
        .checked_mul(1_000_000)
        .ok_or_else(|| e("more than 1".into()))?;
    let den = 10u128.pow(d.scale);
    if num % den != 0 {
        return Err(e("more precise than 0.000001".into()));
    }
    let ppm = num / den;
    if ppm > PPM as u128 {
        return Err(e(
            "more than 1 (use a fraction of the device, 0.25 or 25%)".into()
        ));
    }
    Ok(Share(ppm as u32))
}

/// `GPUSLICE_COMPUTE`-style value, per device or for all.
pub fn parse_fraction_per_device(
    variable: &str,
    value: &str,
) -> Result<PerDevice<Share>, QuantityError> {
    parse_per_device(variable, value, FRACTION_FORMS, parse_fraction)
}

/// One compute cap (`GPUSLICE_COMPUTE_CAP`, `--compute-cap`): a fraction like
/// [`parse_fraction`], but never 0 (a ceiling of 0 would never let a kernel run); 1 is none.
pub fn parse_cap(variable: &str, value: &str) -> Result<Cap, QuantityError> {
    let share = parse_fraction(variable, value).map_err(|mut e| {
        e.accepted = CAP_FORMS;
        e
    })?;
    if share.is_none() {
        return Err(err(
            variable,
            value,
            "a cap of 0 would never let a kernel run",
            CAP_FORMS,
        ));
    }
    Ok(Cap::at(share))
}

/// [`parse_cap`], per device or for all.
pub fn parse_cap_per_device(variable: &str, value: &str) -> Result<PerDevice<Cap>, QuantityError> {
    parse_per_device(variable, value, CAP_FORMS, parse_cap)
}

/// `CUDA_DEVICE_SM_LIMIT` as HAMi reads it: a whole percentage, 0 meaning no limit.
pub fn parse_hami_sm_limit(variable: &str, value: &str) -> Result<Cap, QuantityError> {
    let e = |r: &str| err(variable, value, r, HAMI_SM_FORMS);
    let s = value.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(e(if s.starts_with('-') {
            "negative"
        } else {
            "not a whole number"
        }));
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err(e("leading zero (HAMi would read it as octal)"));
    }
    match s.parse::<u32>() {
        Ok(0) => Ok(Cap::NONE),
        Ok(p) if p <= 100 => Ok(Cap::from_ppm(p * 10_000)),
        _ => Err(e("more than 100")),
    }
}

/// A compute setting as given, for [`check_cap_not_below_share`]: the variable or flag, its
/// value as written, and what it parsed to.
#[derive(Debug, Clone, Copy)]
pub struct ComputeSetting<'a, T> {
    /// `GPUSLICE_COMPUTE`, `--compute-cap`, `CUDA_DEVICE_SM_LIMIT`...
    pub setting: &'a str,
    /// The value as given.
    pub value: &'a str,
    /// Parsed.
    pub parsed: &'a PerDevice<T>,
}

/// The one rule relating a cap to the share it caps: on every device where both apply, the cap
/// is at or above the guaranteed share (a guarantee above its own ceiling is contradictory).
/// The error names both settings and their values.
pub fn check_cap_not_below_share(
    share: ComputeSetting<'_, Share>,
    cap: ComputeSetting<'_, Cap>,
) -> Result<(), QuantityError> {
    fn listed<T>(p: &PerDevice<T>) -> Vec<u32> {
        match p {
            PerDevice::All(_) => vec![],
            PerDevice::Each(l) => l.iter().map(|(i, _)| *i).collect(),
        }
    }
    let mut devices = listed(share.parsed);
    devices.extend(listed(cap.parsed));
    if devices.is_empty() {
        devices.push(0); // both apply to every device alike
    }
    for i in devices {
        let (Some(s), Some(c)) = (share.parsed.get(i), cap.parsed.get(i)) else {
            continue;
        };
        let Some(c) = c.limit().filter(|&c| c < s) else {
            continue;
        };
        let what = match (share.parsed, cap.parsed) {
            (PerDevice::All(_), PerDevice::All(_)) => format!(
                "the cap {} is below {}={:?}",
                ppm_fraction(c),
                share.setting,
                share.value
            ),
            _ => format!(
                "on device {i} the cap {} is below the share {} that {}={:?} gives",
                ppm_fraction(c),
                ppm_fraction(s),
                share.setting,
                share.value
            ),
        };
        return Err(err(
            cap.setting,
            cap.value,
            format!("{what}: a slice cannot be guaranteed more than its ceiling"),
            CAP_VS_SHARE,
        ));
    }
    Ok(())
}

fn ppm_fraction(s: Share) -> String {
    let s = format!("{:.6}", s.fraction());
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of the error `r` must be (the test fails on `Ok`).
    fn refused<T: std::fmt::Debug>(r: Result<T, impl std::fmt::Display>) -> String {
        match r {
            Ok(v) => panic!("accepted: {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn one_none_each() {
        assert!(Share::NONE.is_none() && Share::default().is_none());
        assert_eq!(Share::from_ppm(PPM + 1), Share::WHOLE);
        assert!(Cap::NONE.is_none() && Cap::default().is_none());
        assert_eq!(Cap::at(Share::WHOLE), Cap::NONE);
        assert_eq!(Cap::from_ppm(0), Cap::NONE);
        assert_eq!(Cap::from_ppm(u32::MAX).limit(), None);
        assert_eq!(
            Cap::from_ppm(300_000).limit(),
            Some(Share::from_ppm(300_000))
        );
        assert_eq!(Cap::NONE.ppm(), PPM);
    }

    #[test]
    fn caps() {
        assert!(parse_cap_per_device("GPUSLICE_COMPUTE_CAP", "0").is_err());
        assert!(parse_cap_per_device("GPUSLICE_COMPUTE_CAP", "0=0.5,1=0").is_err());
        assert_eq!(
            parse_cap_per_device("GPUSLICE_COMPUTE_CAP", "30%").unwrap(),
            PerDevice::All(Cap::from_ppm(300_000))
        );
        assert_eq!(parse_cap("C", "1").unwrap(), Cap::NONE);
        let check = |s: &str, c: &str| {
            let (sp, cp) = (
                parse_fraction_per_device("GPUSLICE_COMPUTE", s).unwrap(),
                parse_cap_per_device("GPUSLICE_COMPUTE_CAP", c).unwrap(),
            );
            check_cap_not_below_share(
                ComputeSetting {
                    setting: "GPUSLICE_COMPUTE",
                    value: s,
                    parsed: &sp,
                },
                ComputeSetting {
                    setting: "GPUSLICE_COMPUTE_CAP",
                    value: c,
                    parsed: &cp,
                },
            )
        };
        assert!(check("0.25", "0.5").is_ok());
        assert!(check("0.5", "0.5").is_ok());
        assert!(check("1", "1").is_ok());
        assert!(check("0=0.5", "1=0.2").is_ok()); // different devices
        assert!(check("0.5", "1=0.6").is_ok());
        let m = refused(check("0.5", "0.2"));
        assert!(
            m.contains("GPUSLICE_COMPUTE_CAP=\"0.2\"") && m.contains("GPUSLICE_COMPUTE=\"0.5\""),
            "{m}"
        );
        assert!(refused(check("0.5", "0=0.6,1=0.4")).contains("device 1"));
        assert!(check("1=0.5", "0.4").is_err());
    }

    #[test]
    fn fractions() {
        let ppm = |v: &str| parse_fraction("C", v).unwrap().ppm();
        assert_eq!(ppm("0.25"), 250_000);
        assert_eq!(ppm("25%"), 250_000);
        assert_eq!(ppm("1"), 1_000_000);
        assert_eq!(ppm("0"), 0);
        assert_eq!(ppm(".5"), 500_000);
        for v in [
            "1.5",
            "-0.1",
            "",
            "abc",
            "150%",
            "0.25x",
            "1e-1",
            "0.0000001",
            "NaN",
        ] {
            assert!(parse_fraction("GPUSLICE_COMPUTE", v).is_err(), "{v}");
        }
        assert_eq!(
            parse_fraction_per_device("C", "0=0.5,1=25%")
                .unwrap()
                .get(1),
            Some(Share::from_ppm(250_000))
        );
    }
}
