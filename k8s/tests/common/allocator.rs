//! A test allocator for one request on a ResourceSlice's shareable devices, following
//! kube-scheduler's consumable-capacity rules (k8s.io/dynamic-resource-allocation/structured,
//! `requestsContainNonExistCapacity`, `calculateConsumedCapacity`, `fillEmptyRequest`,
//! `roundUpRange`, and the sum check of `CmpRequestOverCapacity`):
//!
//! - a device is a candidate only if it has every capacity the request names, by exact name;
//! - for each capacity of the device, what the request consumes is: the request's amount
//!   rounded up to the policy (below `min`: `min`; else `min + n*step` for the smallest such
//!   `n`; with `validValues`, the smallest value not below it); with no amount named, the
//!   policy's default, or without a policy the whole capacity value; with no policy, the
//!   amount as asked;
//! - the device fits if, for every capacity, what earlier allocations consumed plus this stays
//!   within the capacity's value.
//!
//! The first device that fits is taken, in the slice's order (the scheduler tries devices in
//! order too).

use super::strict::quantity_milli;
use serde_json::Value;
use std::collections::BTreeMap;

/// One allocation: the device, and the consumed capacity in thousandths, by capacity name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub device: String,
    pub consumed: BTreeMap<String, i128>,
}

impl Allocation {
    /// The consumed capacity as the API server writes it in the claim's allocation
    /// (`consumedCapacity`: whole quantities).
    pub fn quantities(&self) -> BTreeMap<String, String> {
        self.consumed
            .iter()
            .map(|(k, v)| {
                assert_eq!(v % 1000, 0, "{k} consumed a fraction");
                (k.clone(), (v / 1000).to_string())
            })
            .collect()
    }
}

fn q(v: &Value) -> i128 {
    quantity_milli(v.as_str().expect("a quantity string")).expect("a valid quantity")
}

/// `calculateConsumedCapacity` for one capacity; `None` when the request cannot be satisfied by
/// the policy (above `max`, or above every valid value).
fn consumed(requested: Option<i128>, cap: &Value) -> Option<i128> {
    let policy = cap.get("requestPolicy");
    let Some(req) = requested else {
        // fillEmptyRequest
        return Some(match policy.and_then(|p| p.get("default")) {
            Some(d) => q(d),
            None => q(&cap["value"]),
        });
    };
    let Some(policy) = policy else {
        return Some(req);
    };
    if let Some(range) = policy.get("validRange") {
        // roundUpRange
        let min = q(&range["min"]);
        let mut v = if req < min { min } else { req };
        if let Some(step) = range.get("step").map(q) {
            let n = (v - min + step - 1) / step;
            v = min + n * step;
        }
        if range.get("max").is_some_and(|m| v > q(m)) {
            return None;
        }
        return Some(v);
    }
    if let Some(values) = policy.get("validValues").and_then(Value::as_array) {
        // roundUpValidValues
        return values.iter().map(q).find(|&o| o >= req);
    }
    Some(req)
}

/// Place `request` (capacity name -> quantity) on the first device of `slice` that fits next
/// to `earlier`; `Err` says why each device did not.
pub fn allocate(
    slice: &Value,
    earlier: &[Allocation],
    request: &[(&str, &str)],
) -> Result<Allocation, String> {
    let mut why = vec![];
    for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
        let name = d["name"].as_str().unwrap().to_string();
        if d["allowMultipleAllocations"] != true {
            why.push(format!("{name}: not shareable"));
            continue;
        }
        let empty = serde_json::Map::new();
        let caps = d["capacity"].as_object().unwrap_or(&empty);
        // requestsContainNonExistCapacity: exact names.
        if let Some((missing, _)) = request.iter().find(|(k, _)| !caps.contains_key(*k)) {
            why.push(format!("{name}: no capacity named {missing:?}"));
            continue;
        }
        let mut take = BTreeMap::new();
        let mut fits = true;
        for (cname, cap) in caps {
            let asked = request
                .iter()
                .find(|(k, _)| k == cname)
                .map(|(_, v)| quantity_milli(v).expect("a valid request quantity"));
            let Some(c) = consumed(asked, cap) else {
                why.push(format!("{name}: {cname} request outside the policy"));
                fits = false;
                break;
            };
            let used: i128 = earlier
                .iter()
                .filter(|a| a.device == name)
                .map(|a| a.consumed.get(cname).copied().unwrap_or(0))
                .sum();
            if used + c > q(&cap["value"]) {
                why.push(format!(
                    "{name}: {cname} {used} + {c} over {} (thousandths)",
                    q(&cap["value"])
                ));
                fits = false;
                break;
            }
            take.insert(cname.clone(), c);
        }
        if fits {
            return Ok(Allocation {
                device: name,
                consumed: take,
            });
        }
    }
    Err(why.join("; "))
}
