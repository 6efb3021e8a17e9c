//! What the API server checks of a ResourceSlice before it stores one, as the strict fake API
//! server (`apiserver.rs`) checks every object the plugin sends:
//!
//! 1. **Schema** (decoding; answered 400 BadRequest): the `resource.k8s.io/v1` OpenAPI schema of
//!    Kubernetes 1.37 in `schema/resource.k8s.io-v1.json` (types, int64 formats, required fields,
//!    quantities), every object closed: a field the schema does not declare is refused, as
//!    with `fieldValidation=Strict` (`kubectl apply --validate=strict`).
//! 2. **Validation** (answered 422 Invalid): the rules of `ValidateResourceSlice` in
//!    kubernetes/pkg/apis/resource/validation/validation.go (1.37 development tree) that reach
//!    what a node-local driver publishes; each rule names the function that defines it. Limits
//!    are the constants of pkg/apis/resource/types.go.
//!
//! Errors are worded as the API server's `field.Error`s (`PATH: Invalid value: V: DETAIL`).

use serde_json::Value;

/// The schema facts (see `schema/extract.py`).
const SCHEMA: &str = include_str!("../schema/resource.k8s.io-v1.json");

// pkg/apis/resource/types.go
const RESOURCE_SLICE_MAX_DEVICES: usize = 128; // ResourceSliceMaxDevices
const RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS: usize = 64; // ...WithTaintsOrConsumesCounters
const DEVICE_TAINTS_MAX_LENGTH: usize = 16; // DeviceTaintsMaxLength
const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32; // ResourceSliceMaxAttributesAndCapacitiesPerDevice
const DEVICE_MAX_ID_LENGTH: usize = 32; // DeviceMaxIDLength
const DEVICE_MAX_DOMAIN_LENGTH: usize = 63; // DeviceMaxDomainLength
const ATTRIBUTE_MAX_VALUE_LENGTH: usize = 64; // DeviceAttributeMaxValueLength
const POOL_NAME_MAX_LENGTH: usize = 253; // PoolNameMaxLength (DNS1123SubdomainMaxLength)

/// A failed check: the HTTP answer it gets, and the API server's error text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: u16,
    pub reason: &'static str,
    pub errors: Vec<(String, String)>, // (field, full error text)
}

/// Check a ResourceSlice as the API server would on create or apply.
pub fn check_resource_slice(obj: &Value) -> Result<(), Refusal> {
    let schema: Value = serde_json::from_str(SCHEMA).expect("the schema file is JSON");
    assert_eq!(schema["kubernetes"], "1.37");
    let defs = &schema["definitions"];
    let mut errs = vec![];
    check_schema(
        defs,
        &serde_json::json!({"$ref": schema["root"]}),
        obj,
        "",
        &mut errs,
    );
    for (k, want) in [
        ("apiVersion", "resource.k8s.io/v1"),
        ("kind", "ResourceSlice"),
    ] {
        if obj[k] != want {
            errs.push((
                k.into(),
                format!("{k}: Invalid value: {}: must be {want}", obj[k]),
            ));
        }
    }
    if !errs.is_empty() {
        return Err(Refusal {
            code: 400,
            reason: "BadRequest",
            errors: errs,
        });
    }
    let errs = validate_resource_slice(obj);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(Refusal {
            code: 422,
            reason: "Invalid",
            errors: errs,
        })
    }
}

impl Refusal {
    /// The API server's `Status` for this refusal of the ResourceSlice `name`.
    pub fn status(&self, name: &str) -> Value {
        let texts: Vec<&str> = self.errors.iter().map(|e| e.1.as_str()).collect();
        let all = if texts.len() == 1 {
            texts[0].to_string()
        } else {
            format!("[{}]", texts.join(", "))
        };
        let message = if self.code == 400 {
            format!("strict decoding error: {all}")
        } else {
            format!("ResourceSlice.resource.k8s.io {name:?} is invalid: {all}")
        };
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": self.reason, "code": self.code,
            "details": {
                "name": name, "group": "resource.k8s.io", "kind": "ResourceSlice",
                "causes": self.errors.iter().map(|(f, m)| serde_json::json!({
                    "reason": "FieldValueInvalid",
                    "message": m.strip_prefix(&format!("{f}: ")).unwrap_or(m),
                    "field": f,
                })).collect::<Vec<_>>(),
            },
        })
    }
}

// ---------------------------------------------------------------------------------------------
// 1. The schema.

fn check_schema(
    defs: &Value,
    schema: &Value,
    v: &Value,
    path: &str,
    errs: &mut Vec<(String, String)>,
) {
    if let Some(r) = schema["$ref"].as_str() {
        let def = defs
            .get(r)
            .unwrap_or_else(|| panic!("schema: no definition {r}"));
        return check_schema(defs, def, v, path, errs);
    }
    let at = |p: &str| {
        if p.is_empty() {
            "<root>".to_string()
        } else {
            p.to_string()
        }
    };
    let mut bad = |why: String| errs.push((at(path), format!("{}: {why}", at(path))));
    if schema["x-kubernetes-int-or-string"] == true {
        // A Quantity: a string in its grammar, or a number.
        match v {
            Value::String(s) if quantity_milli(s).is_some() => {}
            Value::Number(n) if n.is_i64() => {}
            _ => bad(format!(
                "quantities must match the regular expression \
                 '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$', got {v}"
            )),
        }
        return;
    }
    match schema["type"].as_str() {
        Some("object") => {
            let Some(o) = v.as_object() else {
                return bad(format!("expected an object, got {v}"));
            };
            if let Some(props) = schema["properties"].as_object() {
                for (k, fv) in o {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    match props.get(k) {
                        Some(s) => check_schema(defs, s, fv, &p, errs),
                        None => errs.push((p.clone(), format!("unknown field {p:?}"))),
                    }
                }
                for r in schema["required"].as_array().into_iter().flatten() {
                    let r = r.as_str().unwrap();
                    if !o.contains_key(r) {
                        let p = if path.is_empty() {
                            r.to_string()
                        } else {
                            format!("{path}.{r}")
                        };
                        errs.push((p.clone(), format!("{p}: Required value")));
                    }
                }
            } else if let Some(item) = schema.get("additionalProperties") {
                for (k, fv) in o {
                    check_schema(defs, item, fv, &format!("{path}[{k}]"), errs);
                }
            } // else free-form (FieldsV1)
        }
        Some("array") => {
            let Some(a) = v.as_array() else {
                return bad(format!("expected an array, got {v}"));
            };
            for (i, item) in a.iter().enumerate() {
                check_schema(defs, &schema["items"], item, &format!("{path}[{i}]"), errs);
            }
        }
        Some("string") => {
            if !v.is_string() {
                bad(format!("expected a string, got {v}"));
            }
        }
        Some("boolean") => {
            if !v.is_boolean() {
                bad(format!("expected a boolean, got {v}"));
            }
        }
        Some("integer") => {
            let ok = match schema["format"].as_str() {
                Some("int32") => v.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
                _ => v.is_i64(),
            };
            if !ok {
                bad(format!(
                    "expected an integer ({}), got {v}",
                    schema["format"]
                ));
            }
        }
        other => panic!("schema: type {other:?} at {path} not handled"),
    }
}

/// A quantity's value in thousandths, rounded up (the API server keeps 3 decimal places);
/// `None` when it is not in the grammar of apimachinery's `resource.ParseQuantity`. Written
/// apart from the plugin's own reader (`gpuslice-quantity`) on purpose: this models the API
/// server that checks the plugin, so it must not share the plugin's code or its mistakes.
pub fn quantity_milli(s: &str) -> Option<i128> {
    let (neg, t) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return None;
    }
    let mut mant: i128 = format!("{int}{frac}0").parse::<i128>().ok()? / 10;
    let mut exp10 = -(frac.len() as i32);
    let mut shift = 0u32;
    match suffix {
        "" => {}
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
            shift = 10 * (1 + "KMGTPE".find(&suffix[..1])? as u32);
        }
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        e if e.starts_with(['e', 'E']) => exp10 += e[1..].parse::<i32>().ok()?,
        _ => return None,
    }
    mant = mant.checked_mul(1i128.checked_shl(shift)?)?;
    exp10 += 3; // thousandths
    let milli = if exp10 >= 0 {
        mant.checked_mul(10i128.checked_pow(exp10 as u32)?)?
    } else {
        let d = 10i128.checked_pow((-exp10) as u32)?;
        (mant + d - 1) / d
    };
    // More than 2^63-1 in magnitude is capped by the API server; nothing here gets near.
    Some(if neg { -milli } else { milli })
}

// ---------------------------------------------------------------------------------------------
// 2. Validation (pkg/apis/resource/validation/validation.go).

type Errs = Vec<(String, String)>;

fn invalid(errs: &mut Errs, f: &str, v: &str, detail: &str) {
    errs.push((f.into(), format!("{f}: Invalid value: {v:?}: {detail}")));
}
fn required(errs: &mut Errs, f: &str, detail: &str) {
    let d = if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    };
    errs.push((f.into(), format!("{f}: Required value{d}")));
}
fn forbidden(errs: &mut Errs, f: &str, detail: &str) {
    errs.push((f.into(), format!("{f}: Forbidden: {detail}")));
}

/// `validation.IsDNS1123Label`.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}
/// `validation.IsDNS1123Subdomain`.
fn dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns_label)
}
/// `corevalidation.ValidateCSIDriverName` (a driver name, and the domain of a qualified name):
/// at most 63 characters, a DNS subdomain.
fn driver_name(errs: &mut Errs, f: &str, s: &str) {
    if s.is_empty() {
        return required(errs, f, "");
    }
    if s.len() > DEVICE_MAX_DOMAIN_LENGTH {
        errs.push((
            f.into(),
            format!("{f}: Too long: may not be more than 63 bytes"),
        ));
    }
    if !dns_subdomain(&s.to_ascii_lowercase()) {
        invalid(errs, f, s, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'");
    }
}
/// `validateCIdentifier`: at most DeviceMaxIDLength, `[A-Za-z_][A-Za-z0-9_]*`.
fn c_identifier(errs: &mut Errs, f: &str, s: &str) {
    if s.len() > DEVICE_MAX_ID_LENGTH {
        errs.push((
            f.into(),
            format!("{f}: Too long: may not be more than {DEVICE_MAX_ID_LENGTH} bytes"),
        ));
    }
    let ok = s
        .bytes()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
    if !ok {
        invalid(errs, f, s, "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_' (regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')");
    }
}
/// `validateQualifiedName`: an attribute or capacity name, `ID` or `DOMAIN/ID`.
fn qualified_name(errs: &mut Errs, f: &str, s: &str) {
    let parts: Vec<&str> = s.split('/').collect();
    match parts[..] {
        [id] => c_identifier(errs, f, id),
        [domain, id] => {
            if domain.is_empty() {
                invalid(errs, f, "", "the domain must not be empty");
            } else {
                driver_name(errs, f, domain);
            }
            if id.is_empty() {
                invalid(errs, f, "", "the name must not be empty");
            } else {
                c_identifier(errs, f, id);
            }
        }
        _ => invalid(errs, f, s, "must not contain more than one slash"),
    }
}

fn str_at<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

/// `ValidateResourceSlice` → `ValidateObjectMeta` (name: `NameIsDNSSubdomain`) and
/// `validateResourceSliceSpec`.
fn validate_resource_slice(obj: &Value) -> Errs {
    let mut errs = vec![];
    let name = str_at(&obj["metadata"], "name").unwrap_or("");
    if name.is_empty() {
        required(
            &mut errs,
            "metadata.name",
            "name or generateName is required",
        );
    } else if !dns_subdomain(name) {
        invalid(&mut errs, "metadata.name", name, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character");
    }
    for (i, o) in obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        // ValidateOwnerReferences: apiVersion, kind, name and uid are required.
        for k in ["apiVersion", "kind", "name", "uid"] {
            if str_at(o, k).unwrap_or("").is_empty() {
                required(&mut errs, &format!("metadata.ownerReferences[{i}].{k}"), "");
            }
        }
    }
    let spec = &obj["spec"];
    // validateResourceSliceSpec: the driver (validateDriverName = ValidateCSIDriverName).
    driver_name(
        &mut errs,
        "spec.driver",
        str_at(spec, "driver").unwrap_or(""),
    );
    // validateResourcePool.
    let pool = &spec["pool"];
    let pool_name = str_at(pool, "name").unwrap_or("");
    if pool_name.is_empty() {
        required(&mut errs, "spec.pool.name", "");
    } else {
        // validatePoolName: at most PoolNameMaxLength, DNS subdomains separated by slashes.
        if pool_name.len() > POOL_NAME_MAX_LENGTH {
            errs.push((
                "spec.pool.name".into(),
                "spec.pool.name: Too long: may not be more than 253 bytes".into(),
            ));
        }
        if !pool_name.split('/').all(dns_subdomain) {
            invalid(&mut errs, "spec.pool.name", pool_name, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'");
        }
    }
    if pool["resourceSliceCount"].as_i64().unwrap_or(0) <= 0 {
        invalid(
            &mut errs,
            "spec.pool.resourceSliceCount",
            &pool["resourceSliceCount"].to_string(),
            "must be greater than zero",
        );
    }
    if pool["generation"].as_i64().unwrap_or(-1) < 0 {
        invalid(
            &mut errs,
            "spec.pool.generation",
            &pool["generation"].to_string(),
            "must be greater than or equal to zero",
        );
    }
    // Exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection.
    let mut set = vec![];
    if let Some(n) = spec.get("nodeName") {
        let n = n.as_str().unwrap_or("");
        if n.is_empty() {
            invalid(
                &mut errs,
                "spec.nodeName",
                n,
                "must be either unset or set to a non-empty string",
            );
        } else {
            set.push("`nodeName`");
            if !dns_subdomain(n) {
                invalid(&mut errs, "spec.nodeName", n, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'");
            }
        }
    }
    if spec.get("nodeSelector").is_some() {
        set.push("`nodeSelector`");
    }
    for k in ["allNodes", "perDeviceNodeSelection"] {
        match spec.get(k) {
            Some(Value::Bool(true)) => set.push(if k == "allNodes" {
                "`allNodes`"
            } else {
                "`perDeviceNodeSelection`"
            }),
            Some(v) => invalid(
                &mut errs,
                &format!("spec.{k}"),
                &v.to_string(),
                "must be either unset or set to true",
            ),
            None => {}
        }
    }
    match set.len() {
        0 => required(&mut errs, "spec", "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"),
        1 => {}
        _ => invalid(&mut errs, "spec", &format!("{{{}}}", set.join(", ")), "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set"),
    }
    if spec.get("sharedCounters").is_some() && spec.get("devices").is_some() {
        invalid(
            &mut errs,
            "spec",
            "",
            "only one of `sharedCounters` or `devices` is allowed",
        );
    }
    // validateSet(spec.Devices, maxDevices, validateDevice, by name): 64 instead of 128 when
    // any device has taints (haveDeviceTaints).
    let devices = spec["devices"].as_array().cloned().unwrap_or_default();
    let tainted = devices
        .iter()
        .any(|d| d["taints"].as_array().is_some_and(|t| !t.is_empty()));
    let max = if tainted {
        RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS
    } else {
        RESOURCE_SLICE_MAX_DEVICES
    };
    if devices.len() > max {
        errs.push((
            "spec.devices".into(),
            format!(
                "spec.devices: Too many: {}: must have at most {max} items",
                devices.len()
            ),
        ));
        return errs;
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, d) in devices.iter().enumerate() {
        let f = format!("spec.devices[{i}]");
        validate_device(&mut errs, &f, d);
        let name = str_at(d, "name").unwrap_or("");
        if !names.insert(name.to_string()) {
            errs.push((f.clone(), format!("{f}: Duplicate value: {name:?}")));
        }
    }
    errs
}

/// `validateDevice`, for what a node-local device carries (no counters or per-device node
/// selection: gpuslice sends none).
fn validate_device(errs: &mut Errs, f: &str, d: &Value) {
    let name = str_at(d, "name").unwrap_or("");
    // validateDeviceName = ValidateDNS1123Label.
    if !dns_label(name) {
        invalid(errs, &format!("{f}.name"), name, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character");
    }
    let empty = serde_json::Map::new();
    let attributes = d["attributes"].as_object().unwrap_or(&empty);
    let capacity = d["capacity"].as_object().unwrap_or(&empty);
    let n = attributes.len() + capacity.len();
    if n > MAX_ATTRIBUTES_AND_CAPACITIES {
        invalid(errs, f, &n.to_string(), &format!("the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"));
    }
    for k in ["nodeName", "nodeSelector", "allNodes"] {
        if d.get(k).is_some() {
            invalid(errs, f, "null", "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec");
        }
    }
    // validateMap(attributes, validateQualifiedName, validateDeviceAttribute).
    for (k, a) in attributes {
        let af = format!("{f}.attributes[{k}]");
        qualified_name(errs, &af, k);
        let set: Vec<&String> = a
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        if set.len() != 1 {
            invalid(
                errs,
                &af,
                &a.to_string(),
                "exactly one value must be specified",
            );
        }
        for kind in ["string", "version"] {
            if let Some(s) = str_at(a, kind) {
                if s.len() > ATTRIBUTE_MAX_VALUE_LENGTH {
                    errs.push((format!("{af}.{kind}"), format!("{af}.{kind}: Too long: may not be more than {ATTRIBUTE_MAX_VALUE_LENGTH} bytes")));
                }
            }
        }
    }
    // validateSlice(device.Taints, DeviceTaintsMaxLength, validateDeviceTaint).
    if let Some(taints) = d["taints"].as_array() {
        let tf = format!("{f}.taints");
        if taints.len() > DEVICE_TAINTS_MAX_LENGTH {
            errs.push((
                tf.clone(),
                format!(
                    "{tf}: Too many: {}: must have at most {DEVICE_TAINTS_MAX_LENGTH} items",
                    taints.len()
                ),
            ));
        }
        for (i, t) in taints.iter().enumerate() {
            validate_device_taint(errs, &format!("{tf}[{i}]"), t);
        }
    }
    let multi = d["allowMultipleAllocations"] == true;
    for (k, c) in capacity {
        let cf = format!("{f}.capacity[{k}]");
        qualified_name(errs, &cf, k);
        let Some(policy) = c.get("requestPolicy") else {
            continue;
        };
        if !multi {
            // validateSingleAllocatableDeviceCapacity.
            forbidden(
                errs,
                &format!("{cf}.requestPolicy"),
                "allowMultipleAllocations must be true",
            );
            continue;
        }
        let value = str_at(c, "value").and_then(quantity_milli).unwrap_or(0);
        validate_request_policy(errs, &format!("{cf}.requestPolicy"), value, policy);
    }
}

/// `validation.IsQualifiedName`'s name part and `IsValidLabelValue`'s value: at most 63
/// characters, `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn label_part(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_none_or(u8::is_ascii_alphanumeric)
        && b.last().is_none_or(u8::is_ascii_alphanumeric)
}

/// `validateDeviceTaint` (1.37: effects None, NoSchedule, NoExecute): the key a label name
/// (`metav1validation.ValidateLabelName`: `[PREFIX/]NAME`, the prefix a DNS subdomain), the
/// value a label value, the effect required and one of the three.
fn validate_device_taint(errs: &mut Errs, f: &str, t: &Value) {
    let kf = format!("{f}.key");
    let key = str_at(t, "key").unwrap_or("");
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        invalid(errs, &kf, key, "name part must be non-empty");
    } else if !label_part(name) {
        invalid(errs, &kf, key, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')");
    }
    if let Some(p) = prefix {
        if !dns_subdomain(p) || key.matches('/').count() > 1 {
            invalid(errs, &kf, key, "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character");
        }
    }
    let value = str_at(t, "value").unwrap_or("");
    if !label_part(value) {
        invalid(errs, &format!("{f}.value"), value, "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')");
    }
    let ef = format!("{f}.effect");
    match str_at(t, "effect").unwrap_or("") {
        "" => required(errs, &ef, ""),
        "NoExecute" | "NoSchedule" | "None" => {}
        e => errs.push((
            ef.clone(),
            format!("{ef}: Unsupported value: {e:?}: supported values: \"NoExecute\", \"NoSchedule\", \"None\""),
        )),
    }
}

fn q(v: &Value) -> Option<i128> {
    v.as_str()
        .and_then(quantity_milli)
        .or_else(|| v.as_i64().map(|n| n as i128 * 1000))
}
fn show(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// `validateRequestPolicy` → `validateValidRequestValues` → `validateRequestPolicyRange` and
/// `validateRequestPolicyRangeStep` (the integer path: gpuslice's quantities are whole).
fn validate_request_policy(errs: &mut Errs, f: &str, cap: i128, policy: &Value) {
    let values = policy.get("validValues").and_then(Value::as_array);
    let range = policy.get("validRange");
    if values.is_some_and(|v| !v.is_empty()) && range.is_some() {
        return forbidden(errs, f, "exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time");
    }
    let cap_s = format!("{}", cap / 1000);
    let Some(range) = range else {
        if let Some(values) = values.filter(|v| !v.is_empty()) {
            let Some(default) = policy.get("default").and_then(q) else {
                return required(
                    errs,
                    &format!("{f}.default"),
                    "required when validValues is defined",
                );
            };
            let mut found = false;
            for (i, o) in values.iter().enumerate() {
                let ov = q(o).unwrap_or(0);
                if ov > cap {
                    invalid(
                        errs,
                        &format!("{f}.validValues[{i}]"),
                        &show(o),
                        &format!("option is larger than capacity value: {cap_s}"),
                    );
                }
                found |= ov == default;
            }
            if !found {
                invalid(
                    errs,
                    &format!("{f}.validValues"),
                    &show(&policy["default"]),
                    "default value is not valid according to the requestPolicy",
                );
            }
        }
        return;
    };
    let f = format!("{f}.validRange");
    let Some(default) = policy.get("default").and_then(q) else {
        return required(
            errs,
            &format!("{f}.default"),
            "required when validRange is defined",
        );
    };
    let Some(min) = range.get("min").and_then(q) else {
        return required(
            errs,
            &format!("{f}.min"),
            "required when validRange is defined",
        );
    };
    let min_s = show(&range["min"]);
    if min > cap {
        invalid(
            errs,
            &format!("{f}.min"),
            &min_s,
            &format!("min is larger than capacity value: {cap_s}"),
        );
    }
    if default < min {
        invalid(
            errs,
            &format!("{f}.default"),
            &show(&policy["default"]),
            &format!("default is less than min: {min_s}"),
        );
    }
    let max = range.get("max").and_then(q);
    if let Some(max) = max {
        let max_s = show(&range["max"]);
        if min > max {
            invalid(
                errs,
                &format!("{f}.max"),
                &min_s,
                &format!("min is larger than max: {max_s}"),
            );
        }
        if max > cap {
            invalid(
                errs,
                &format!("{f}.max"),
                &max_s,
                &format!("max is larger than capacity value: {cap_s}"),
            );
        }
        if default > max {
            invalid(
                errs,
                &format!("{f}.default"),
                &show(&policy["default"]),
                &format!("default is more than max: {max_s}"),
            );
        }
    }
    let Some(step) = range.get("step").and_then(q) else {
        return;
    };
    let step_s = show(&range["step"]);
    if step <= 0 {
        return invalid(
            errs,
            &format!("{f}.step"),
            &step_s,
            "must be greater than zero",
        );
    }
    if min + step > cap {
        invalid(
            errs,
            &format!("{f}.step"),
            &step_s,
            &format!(
                "one step {} is larger than capacity value: {cap_s}",
                (min + step) / 1000
            ),
        );
    }
    for (what, v) in [("default", Some(default)), ("max", max)] {
        let Some(v) = v else { continue };
        if (v - min) % step != 0 {
            let shown = if what == "default" {
                show(&policy["default"])
            } else {
                show(&range["max"])
            };
            invalid(
                errs,
                &format!("{f}.step"),
                &shown,
                &format!("value is not a multiple of a given step ({step_s}) from ({min_s})"),
            );
        }
    }
}
