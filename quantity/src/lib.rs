//! The settings grammar: the one parser for sizes, fractions and Kubernetes quantities, used by
//! the shim (variables), the `gpuslice` CLI (flags), `gpuslice-burn` and `gpuslice-dra`, all
//! with one unit table ([`kubernetes_unit`]).
//!
//! Forms accepted:
//! - sizes (`GPUSLICE_MEMORY`, `--memory`): plain bytes `4294967296`; Kubernetes quantities
//!   `4Gi` `4096Mi` (binary: Ki Mi Gi Ti Pi Ei) and `4G` `500M` `1k` (decimal: k K M G T P E);
//!   byte suffixes `4GiB`, `4GB`, `512B`; decimals when they come to whole bytes (`1.5Gi`);
//!   a percentage of the device `25%`; per device `0=4Gi,1=8Gi` (see [`parse_per_device`]).
//! - fractions (`GPUSLICE_COMPUTE`, `GPUSLICE_COMPUTE_CAP`): `0.25` or `25%`, between 0 and 1.
//! - Kubernetes quantities as the API server writes them (`consumedCapacity`, the DRA plugin's
//!   flags): [`parse_kubernetes`] also reads the sub-units `n` `u` `m` and exponents `1e3`,
//!   rounding up to an integer; [`kubernetes_bytes`] writes bytes back canonically (`4Gi`).
//! - the HAMi compatibility variables ([`parse_hami_size`], [`parse_hami_sm_limit`]) with the
//!   meaning HAMi-core gives them: `1g`, `512m`, `64k` in binary units (either case), a plain
//!   number in bytes; and, unlike HAMi, everything it would silently misread is an error.
//!
//! - the rules across settings, so the shim, `gpuslice run`/`cdi` and `slice create` agree:
//!   [`check_slice_name`], [`parse_cap_per_device`] (never 0) and
//!   [`check_cap_not_below_share`].
//! - the settings file ([`settings_file`]): the same variables as lines of a file, for a
//!   container's processes that lose their environment.
//!
//! Nothing here ever turns a bad value into "unlimited": every function returns an error that
//! names the variable, the value and the accepted forms.

#![deny(missing_docs)]

mod kubernetes;
pub mod settings_file;
mod share;

pub use kubernetes::{kubernetes_bytes, parse_kubernetes, KUBERNETES_FORMS};

pub use share::{
    check_cap_not_below_share, parse_cap, parse_cap_per_device, parse_fraction,
    parse_fraction_per_device, parse_hami_sm_limit, Cap, ComputeSetting, Share, CAP_FORMS,
    CAP_VS_SHARE,
};

use std::fmt;

/// Parts per million: the unit a [`Share`] and a [`Cap`] hold (and a percentage of memory).
/// `PPM` is the whole device.
pub const PPM: u32 = 1_000_000;

/// Longest slice name (bytes). The ledger's name records hold one more byte (a NUL).
pub const MAX_SLICE_NAME: usize = 63;

/// The binary units (powers of 1024), as Kubernetes writes them: `Ki` is 1024¹.
pub const BINARY_UNITS: [(&str, u32); 6] = [
    ("Ki", 1),
    ("Mi", 2),
    ("Gi", 3),
    ("Ti", 4),
    ("Pi", 5),
    ("Ei", 6),
];
/// The decimal units (powers of 1000), as Kubernetes writes them: `k` is 1000¹.
pub const DECIMAL_UNITS: [(&str, u32); 6] =
    [("k", 1), ("M", 2), ("G", 3), ("T", 4), ("P", 5), ("E", 6)];

/// The multiplier of a Kubernetes quantity suffix (`""`, `Ki`…`Ei`, `k`…`E`), from the one
/// unit table; `None` for anything else (the sub-units `n` `u` `m` and exponents are
/// [`parse_kubernetes`]'s own business, sizes never take them).
pub fn kubernetes_unit(suffix: &str) -> Option<u128> {
    if suffix.is_empty() {
        return Some(1);
    }
    let find = |table: &[(&str, u32)], base: u128| {
        table
            .iter()
            .find(|(s, _)| *s == suffix)
            .map(|(_, p)| base.pow(*p))
    };
    find(&BINARY_UNITS, 1024).or_else(|| find(&DECIMAL_UNITS, 1000))
}

/// A parsed size: bytes, or a share of the device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// An exact byte count.
    Bytes(u64),
    /// Parts per million of the device's total memory (`25%` = 250_000).
    Percent(u32),
}

impl Size {
    /// Bytes on a device of `total` bytes.
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            Size::Bytes(b) => b,
            Size::Percent(ppm) => ((total as u128 * ppm as u128) / 1_000_000) as u64,
        }
    }
}

/// A value that applies to every device, or one value per device index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerDevice<T> {
    /// The same value on every device.
    All(T),
    /// `index=value` pairs; devices not listed get nothing.
    Each(Vec<(u32, T)>),
}

impl<T: Copy> PerDevice<T> {
    /// The value for device `index` (as the process sees it).
    pub fn get(&self, index: u32) -> Option<T> {
        match self {
            PerDevice::All(v) => Some(*v),
            PerDevice::Each(list) => list.iter().find(|(i, _)| *i == index).map(|(_, v)| *v),
        }
    }
}

/// A value that could not be parsed; its message names the variable, the value and what is
/// accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantityError {
    /// The variable or flag the value came from.
    pub variable: String,
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
    /// The accepted forms.
    pub accepted: &'static str,
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} is not valid: {}; accepted: {}",
            self.variable, self.value, self.reason, self.accepted
        )
    }
}

impl std::error::Error for QuantityError {}

/// Accepted size forms, for error messages.
pub const SIZE_FORMS: &str = "bytes (4294967296), 4Gi, 4096Mi, 4G, 4GiB, or 25% of the device; \
                               per device: 0=4Gi,1=8Gi";
/// Accepted fraction forms.
pub const FRACTION_FORMS: &str =
    "a fraction from 0 to 1 (0.25) or a percentage (25%); per device: 0=0.5,1=25%";
/// Accepted forms of `CUDA_DEVICE_MEMORY_LIMIT(_<i>)`.
pub const HAMI_SIZE_FORMS: &str =
    "a whole number with an optional binary unit k, m or g (1g, 512m, 1048576)";
/// Accepted forms of `CUDA_DEVICE_SM_LIMIT`.
pub const HAMI_SM_FORMS: &str = "a whole percentage from 0 (no limit) to 100";

pub(crate) fn err(
    variable: &str,
    value: &str,
    reason: impl Into<String>,
    accepted: &'static str,
) -> QuantityError {
    QuantityError {
        variable: variable.into(),
        value: value.into(),
        reason: reason.into(),
        accepted,
    }
}

/// A decimal number split into `mantissa / 10^scale`, exactly.
pub(crate) struct Decimal {
    pub(crate) mantissa: u128,
    pub(crate) scale: u32,
}

/// Parse `123`, `1.5`, `.5`: ASCII digits with at most one dot; no sign, no exponent.
pub(crate) fn parse_decimal(s: &str) -> Result<Decimal, String> {
    if s.is_empty() {
        return Err("no number".into());
    }
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    let frac = frac.unwrap_or("");
    if int.is_empty() && frac.is_empty() {
        return Err("no number".into());
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(if s.starts_with('-') {
            "negative values are not sizes".into()
        } else {
            format!("{s:?} is not a number")
        });
    }
    if int.len() + frac.len() > 36 {
        return Err("number too large".into());
    }
    let mut mantissa: u128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        mantissa = mantissa * 10 + (b - b'0') as u128; // ≤ 36 digits: fits in u128
    }
    Ok(Decimal {
        mantissa,
        scale: frac.len() as u32,
    })
}

/// `d * unit` as whole bytes, or why not.
fn whole_bytes(d: &Decimal, unit: u128) -> Result<u64, String> {
    let num = d
        .mantissa
        .checked_mul(unit)
        .ok_or("too large (more than 2^64 bytes)")?;
    let den = 10u128.pow(d.scale);
    if num % den != 0 {
        return Err("not a whole number of bytes".into());
    }
    u64::try_from(num / den).map_err(|_| "too large (more than 2^64 bytes)".into())
}

/// The multiplier of a size suffix: a Kubernetes unit ([`kubernetes_unit`]), optionally
/// followed by `B` (`GiB`, `GB`, plain `B`), and `K` as well as `k` for 1000.
fn unit_of(suffix: &str) -> Option<u128> {
    let s = suffix.strip_suffix('B').unwrap_or(suffix);
    match s {
        "K" => Some(1000),
        _ => kubernetes_unit(s),
    }
}

/// Parse a percentage body (`25`, `12.5`) into ppm, 0 < p ≤ 100 (or 0 when `allow_zero`).
pub(crate) fn percent_ppm(body: &str, allow_zero: bool) -> Result<u32, String> {
    let d = parse_decimal(body)?;
    // ppm = body * 10_000, exactly
    let num = d.mantissa.checked_mul(10_000).ok_or("too large")?;
    let den = 10u128.pow(d.scale);
    if num % den != 0 {
        return Err("more precise than 0.0001%".into());
    }
    let ppm = num / den;
    if ppm > 1_000_000 {
        return Err("more than 100%".into());
    }
    if ppm == 0 && !allow_zero {
        return Err("0% of the device".into());
    }
    Ok(ppm as u32)
}

/// How a size or a fraction is written: a percentage (its number, before the `%`) or a plain
/// number with whatever follows it.
pub(crate) enum Form<'a> {
    Percent(&'a str),
    Plain(&'a str),
}

/// `value` without surrounding white space, as a [`Form`]; empty is refused (the reading
/// [`parse_size`] and [`parse_fraction`] share).
pub(crate) fn form(value: &str) -> Result<Form<'_>, String> {
    let s = value.trim();
    if s.is_empty() {
        return Err("empty".into());
    }
    Ok(match s.strip_suffix('%') {
        Some(body) => Form::Percent(body),
        None => Form::Plain(s),
    })
}

/// Parse one size (not the per-device form). `variable` names the source for errors.
pub fn parse_size(variable: &str, value: &str) -> Result<Size, QuantityError> {
    let e = |r: String| err(variable, value, r, SIZE_FORMS);
    let s = match form(value).map_err(e)? {
        Form::Percent(body) => return percent_ppm(body, false).map(Size::Percent).map_err(e),
        Form::Plain(s) => s,
    };
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return Err(e(if s.starts_with('-') {
            "negative values are not sizes".into()
        } else {
            "no number".into()
        }));
    }
    let Some(unit) = unit_of(suffix) else {
        let hint = match suffix {
            "m" => " (in Kubernetes syntax `m` means thousandths; did you mean Mi?)",
            "g" | "gi" | "gb" => " (did you mean Gi?)",
            "mi" | "mb" => " (did you mean Mi?)",
            _ => "",
        };
        return Err(e(format!("unknown unit {suffix:?}{hint}")));
    };
    let d = parse_decimal(num).map_err(e)?;
    whole_bytes(&d, unit).map(Size::Bytes).map_err(e)
}

/// Parse one memory quota (`GPUSLICE_MEMORY`, `--memory`): [`parse_size`], but never 0. A
/// quota of 0 bytes (or 0%) would refuse every allocation, and HAMi's variables read 0 as "no
/// limit": rather than pick one of those meanings, 0 is an error everywhere (the shim's
/// variables, `gpuslice run`, `gpuslice cdi`, `gpuslice slice create`); leaving the setting
/// unset is how to ask for no quota (best effort).
pub fn parse_quota(variable: &str, value: &str) -> Result<Size, QuantityError> {
    match parse_size(variable, value)? {
        Size::Bytes(0) => Err(err(
            variable,
            value,
            "a quota of 0 bytes would refuse every allocation; unset it for no quota (best \
             effort)",
            SIZE_FORMS,
        )),
        size => Ok(size),
    }
}

/// Parse a value that may be per device (`0=4Gi,1=8Gi`) or one value for all devices, with
/// `one` parsing each value. Indices are as the process sees devices; listing one twice is an
/// error.
pub fn parse_per_device<T>(
    variable: &str,
    value: &str,
    accepted: &'static str,
    one: impl Fn(&str, &str) -> Result<T, QuantityError>,
) -> Result<PerDevice<T>, QuantityError> {
    let s = value.trim();
    if !s.contains('=') {
        return one(variable, s).map(PerDevice::All);
    }
    let mut out: Vec<(u32, T)> = Vec::new();
    for part in s.split(',') {
        let Some((idx, v)) = part.split_once('=') else {
            return Err(err(
                variable,
                value,
                format!("{part:?} has no device index (write i=VALUE for every device)"),
                accepted,
            ));
        };
        let idx = idx.trim();
        let i: u32 = match idx.parse() {
            Ok(i) if idx.bytes().all(|b| b.is_ascii_digit()) && i < 64 => i,
            _ => {
                return Err(err(
                    variable,
                    value,
                    format!("{idx:?} is not a device index (0..63)"),
                    accepted,
                ))
            }
        };
        if out.iter().any(|(j, _)| *j == i) {
            return Err(err(
                variable,
                value,
                format!("device {i} is listed twice"),
                accepted,
            ));
        }
        // Report errors against the whole value so the user sees what they wrote.
        let parsed = one(variable, v).map_err(|mut e| {
            e.value = value.into();
            e.reason = format!("device {i}: {}", e.reason);
            e
        })?;
        out.push((i, parsed));
    }
    Ok(PerDevice::Each(out))
}

/// `GPUSLICE_MEMORY`-style value, per device or for all: quotas, each by [`parse_quota`]
/// (never 0).
pub fn parse_size_per_device(
    variable: &str,
    value: &str,
) -> Result<PerDevice<Size>, QuantityError> {
    parse_per_device(variable, value, SIZE_FORMS, parse_quota)
}

/// `CUDA_DEVICE_MEMORY_LIMIT(_<i>)` as HAMi-core reads it: a whole number with an optional
/// final `k`/`m`/`g` (either case) in binary units; no suffix = bytes. HAMi treats 0, garbage,
/// negative numbers and overflow as "no limit"; here they are errors, as are hex/octal
/// spellings (`0x10`, `010`) that HAMi's `strtoul(.., 0)` would read in another base.
pub fn parse_hami_size(variable: &str, value: &str) -> Result<u64, QuantityError> {
    let e = |r: &str| err(variable, value, r, HAMI_SIZE_FORMS);
    let s = value.trim();
    if s.is_empty() {
        return Err(e("empty"));
    }
    let (num, unit) = match s.as_bytes()[s.len() - 1] {
        b'g' | b'G' => (&s[..s.len() - 1], 1u64 << 30),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'k' | b'K' => (&s[..s.len() - 1], 1 << 10),
        _ => (s, 1),
    };
    if num.starts_with('-') {
        return Err(e("negative"));
    }
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return Err(e("not a whole number with a k, m or g unit"));
    }
    if num.len() > 1 && num.starts_with('0') {
        return Err(e("leading zero (HAMi would read it as octal)"));
    }
    let n: u64 = num.parse().map_err(|_| e("too large"))?;
    let bytes = n
        .checked_mul(unit)
        .ok_or_else(|| e("too large (more than 2^64 bytes)"))?;
    if bytes == 0 {
        return Err(e(
            "0 (HAMi reads it as no limit; unset the variable instead)",
        ));
    }
    Ok(bytes)
}

/// Accepted slice names (`GPUSLICE_SLICE`, `--slice`, `slice create NAME`).
pub const SLICE_NAME_FORMS: &str =
    "1 to 63 letters, digits, '-', '_', '.', ':' or '/', not starting with \"pid-\"";
/// Prefix of processes' private slices (`pid-<pid>`), which no user-given name may take.
pub const PRIVATE_SLICE_PREFIX: &str = "pid-";

/// Whether `name` fits a ledger name record: 1 to [`MAX_SLICE_NAME`] bytes of letters, digits,
/// `-`, `_`, `.`, `:`, `/`. Private slices (`pid-N`) pass this; [`check_slice_name`] adds the
/// rule for names users give.
pub fn storable_name(name: &str) -> bool {
    slice_name_problem(name).is_none()
}

fn slice_name_problem(name: &str) -> Option<String> {
    const MAX: usize = MAX_SLICE_NAME;
    if name.is_empty() {
        return Some("a slice name cannot be empty".into());
    }
    if name.len() > MAX {
        return Some(format!(
            "a slice name is at most {MAX} bytes, this one has {}",
            name.len()
        ));
    }
    name.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.:/".contains(*c)))
        .map(|c| format!("a slice name cannot contain {c:?}"))
}

/// The one rule for a slice name a user gives (`GPUSLICE_SLICE`, `gpuslice run --slice`,
/// `gpuslice slice create NAME`, `gpuslice cdi`): [`storable_name`], and not starting with
/// `pid-` (processes' private slices). `setting` names where the value came from.
pub fn check_slice_name(setting: &str, name: &str) -> Result<(), QuantityError> {
    let reason = slice_name_problem(name).or_else(|| {
        name.starts_with(PRIVATE_SLICE_PREFIX)
            .then(|| "names starting with pid- are processes' private slices".into())
    });
    match reason {
        Some(r) => Err(err(setting, name, r, SLICE_NAME_FORMS)),
        None => Ok(()),
    }
}

/// [`check_slice_name`] as a predicate.
pub fn valid_slice_name(name: &str) -> bool {
    check_slice_name("", name).is_ok()
}

#[cfg(test)]
mod tests;
