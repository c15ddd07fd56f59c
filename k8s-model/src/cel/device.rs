//! The `device` variable of a selector: a device of a ResourceSlice turned into the CEL
//! value the scheduler builds (`DeviceMatches` in `dynamic-resource-allocation/cel`).
//! Pure; values borrow the device's strings rather than copying them.
//!
//! * `device.driver`: the slice's driver.
//! * `device.attributes[domain][id]` and `device.capacity[domain][id]`: a name without a
//!   `domain/` prefix belongs to the driver's domain. An unknown domain is an empty map.
//! * `device.allowMultipleAllocations`: only with the DRAConsumableCapacity gate
//!   (`false` when unset), otherwise absent.
//!
//! As in Kubernetes, every attribute and capacity is converted before evaluation, so a
//! malformed one (an unparsable version, an attribute with no value) fails the selector
//! even when the expression does not mention it.

use std::collections::{BTreeMap, HashMap};

use cel::ExecutionError;
use cel::common::traits::{Container, Indexer, Iterable, Sizer};
use cel::common::types::{CelBool, CelInt, CelList, CelMap, CelMapKey, CelString, MAP_TYPE, Type};
use cel::common::value::{CowVal, Val};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use super::CelError;
use super::quantity::QuantityVal;
use super::semver::parse_strict;
use crate::validation::quantity::Quantity;

/// One device of a ResourceSlice, as a selector sees it.
#[derive(Debug, Clone, Copy)]
pub struct DeviceInput<'a> {
    /// The driver that published the slice (`spec.driver`): `device.driver`, and the
    /// domain of unqualified attribute and capacity names.
    pub driver: &'a str,
    pub device: &'a Device,
    /// Whether `device.allowMultipleAllocations` is visible (gate DRAConsumableCapacity).
    pub consumable_capacity: bool,
}

type Entries<'a> = HashMap<CelMapKey<'a>, Box<dyn Val + 'a>>;

/// Builds the `device` value. Errors: [`CelError::Eval`] naming the attribute or
/// capacity that cannot be converted, in Kubernetes' words.
pub(crate) fn device_value<'a>(input: &DeviceInput<'a>) -> Result<CelMap<'a>, CelError> {
    let mut attributes: BTreeMap<&'a str, Entries<'a>> = BTreeMap::new();
    for (name, attribute) in input.device.attributes.iter().flatten() {
        let value = attribute_value(attribute)
            .map_err(|reason| CelError::Eval(format!("attribute {name}: {reason}")))?;
        let (domain, id) = qualified(name, input.driver);
        attributes
            .entry(domain)
            .or_default()
            .insert(CelMapKey::from(id), value);
    }
    let mut capacity: BTreeMap<&'a str, Entries<'a>> = BTreeMap::new();
    for (name, cap) in input.device.capacity.iter().flatten() {
        let value = Quantity::parse(&cap.value.0)
            .map_err(|e| CelError::Eval(format!("capacity {name}: {}", e.go_message())))?;
        let (domain, id) = qualified(name, input.driver);
        capacity
            .entry(domain)
            .or_default()
            .insert(CelMapKey::from(id), Box::new(QuantityVal(value)));
    }

    let mut device: Entries<'a> = HashMap::new();
    device.insert(
        CelMapKey::from("driver"),
        Box::new(CelString::from(input.driver)),
    );
    device.insert(
        CelMapKey::from("attributes"),
        Box::new(DomainMap::new(attributes)),
    );
    device.insert(
        CelMapKey::from("capacity"),
        Box::new(DomainMap::new(capacity)),
    );
    if input.consumable_capacity {
        let allow = input.device.allow_multiple_allocations.unwrap_or(false);
        device.insert(
            CelMapKey::from("allowMultipleAllocations"),
            Box::new(CelBool::from(allow)),
        );
    }
    Ok(CelMap::from(device))
}

/// Splits `domain/id`; a name without a domain belongs to `driver`.
fn qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    name.split_once('/').unwrap_or((driver, name))
}

/// An attribute's value, lists first, as Kubernetes' `getAttributeValue` with
/// DRAListTypeAttributes enabled.
fn attribute_value(attribute: &DeviceAttribute) -> Result<Box<dyn Val + '_>, String> {
    fn list<'a>(items: impl Iterator<Item = Box<dyn Val + 'a>>) -> Box<dyn Val + 'a> {
        Box::new(CelList::from(items.collect::<Vec<_>>()))
    }
    fn version(s: &str) -> Result<Box<dyn Val + 'static>, String> {
        parse_strict(s)
            .map(|v| Box::new(v) as Box<dyn Val>)
            .map_err(|e| format!("parse semantic version: {e}"))
    }
    let a = attribute;
    Ok(if let Some(ints) = &a.ints {
        list(
            ints.iter()
                .map(|i| Box::new(CelInt::from(*i)) as Box<dyn Val>),
        )
    } else if let Some(bools) = &a.bools {
        list(
            bools
                .iter()
                .map(|b| Box::new(CelBool::from(*b)) as Box<dyn Val>),
        )
    } else if let Some(strings) = &a.strings {
        list(
            strings
                .iter()
                .map(|s| Box::new(CelString::from(s.as_str())) as Box<dyn Val>),
        )
    } else if let Some(versions) = &a.versions {
        let parsed = versions
            .iter()
            .map(|v| version(v))
            .collect::<Result<Vec<_>, _>>()?;
        list(parsed.into_iter())
    } else if let Some(i) = a.int {
        Box::new(CelInt::from(i))
    } else if let Some(b) = a.bool {
        Box::new(CelBool::from(b))
    } else if let Some(s) = &a.string {
        Box::new(CelString::from(s.as_str()))
    } else if let Some(v) = &a.version {
        version(v)?
    } else {
        return Err("unsupported attribute value".to_owned());
    })
}

/// `device.attributes` and `device.capacity`: a map from domain to the map of that
/// domain's values, where looking up an unknown domain yields an empty map rather than a
/// "no such key" error. `in`, `size()` and iteration see the known domains only, as
/// Kubernetes' wrapper (which only overrides `Find`) does.
#[derive(Debug, Clone)]
struct DomainMap<'a> {
    domains: CelMap<'a>,
}

impl<'a> DomainMap<'a> {
    fn new(domains: BTreeMap<&'a str, Entries<'a>>) -> Self {
        let domains: Entries<'a> = domains
            .into_iter()
            .map(|(domain, entries)| {
                let map: Box<dyn Val + 'a> = Box::new(CelMap::from(entries));
                (CelMapKey::from(domain), map)
            })
            .collect();
        DomainMap {
            domains: CelMap::from(domains),
        }
    }
}

impl<'a> Val for DomainMap<'a> {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &MAP_TYPE
    }

    fn as_container(&self) -> Option<&dyn Container> {
        self.domains.as_container()
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
    where
        Self: 'w,
    {
        self.domains.as_iterable()
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        self.domains.as_sizer()
    }

    fn equals(&self, other: &dyn Val) -> bool {
        self.domains.equals(other)
    }

    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(self.clone())
    }
}

impl<'a> Indexer for DomainMap<'a> {
    fn get<'b, 'w>(&'b self, domain: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        match self.domains.get(domain) {
            Err(ExecutionError::NoSuchKey(_)) => Ok(CowVal::owned(CelMap::default())),
            found => found,
        }
    }

    fn steal<'w>(self: Box<Self>, domain: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(domain).map(CowVal::into_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::qualified;

    /// Unqualified names belong to the driver's domain; qualified ones to their own.
    #[test]
    fn names_split_into_domain_and_id() {
        let cases = [
            ("memory", ("gpu.tessera.dev", "memory")),
            (
                "resource.kubernetes.io/pciBusID",
                ("resource.kubernetes.io", "pciBusID"),
            ),
            ("other.com/x", ("other.com", "x")),
        ];
        for (name, want) in cases {
            assert_eq!(qualified(name, "gpu.tessera.dev"), want, "{name}");
        }
    }
}
