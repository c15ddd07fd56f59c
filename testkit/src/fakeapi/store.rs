//! The fake API server's object store: JSON objects keyed by resource, namespace and
//! name, one global resourceVersion counter, and an event history for watches.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tokio::sync::broadcast;

/// A watch event as the API server streams it.
#[derive(Debug, Clone)]
pub struct WatchEvent {
    pub resource: &'static str,
    pub namespace: Option<String>,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    pub object: Value,
    pub resource_version: u64,
}

/// Key of a stored object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub resource: &'static str,
    pub namespace: Option<String>,
    pub name: String,
}

/// All objects plus the history needed to serve watches from a resourceVersion.
pub struct Store {
    objects: BTreeMap<Key, Value>,
    next_rv: u64,
    history: Vec<WatchEvent>,
    events: broadcast::Sender<WatchEvent>,
    uid_counter: u64,
}

/// How many events a watch can resume from; older resourceVersions get 410 Gone.
const HISTORY_LIMIT: usize = 10_000;

impl Store {
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        Store {
            objects: BTreeMap::new(),
            next_rv: 1000,
            history: Vec::new(),
            events,
            uid_counter: 0,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<WatchEvent> {
        self.events.subscribe()
    }

    /// The current resourceVersion (of the last write).
    pub fn current_rv(&self) -> u64 {
        self.next_rv
    }

    /// Events after `rv`, or `None` when `rv` is older than the kept history.
    pub fn events_since(&self, rv: u64) -> Option<Vec<WatchEvent>> {
        if let Some(first) = self.history.first()
            && rv + 1 < first.resource_version
            && self.history.len() >= HISTORY_LIMIT
        {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|e| e.resource_version > rv)
                .cloned()
                .collect(),
        )
    }

    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.objects.contains_key(key)
    }

    /// Objects of a resource, optionally in one namespace, ordered by namespace/name.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|(k, _)| {
                k.resource == resource
                    && namespace.is_none_or(|ns| k.namespace.as_deref() == Some(ns))
            })
            .map(|(_, v)| v)
            .collect()
    }

    /// A fresh UID (RFC 4122 shaped, deterministic sequence).
    pub fn new_uid(&mut self) -> String {
        self.uid_counter += 1;
        let r = fastrand::u64(..);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (r >> 32) as u32,
            (r >> 16) as u16,
            (r & 0xfff) as u16,
            (self.uid_counter & 0xfff) as u16,
            self.uid_counter
        )
    }

    /// Stores an object (create or update), stamping a new resourceVersion, and
    /// records the event. Returns the stored object.
    pub fn put(&mut self, key: Key, mut object: Value, kind: &'static str) -> Value {
        self.next_rv += 1;
        let rv = self.next_rv;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
        }
        self.objects.insert(key.clone(), object.clone());
        self.record(key, kind, object.clone(), rv);
        object
    }

    /// Removes an object and records a DELETED event.
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        self.next_rv += 1;
        let rv = self.next_rv;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
        }
        self.record(key.clone(), "DELETED", object.clone(), rv);
        Some(object)
    }

    fn record(&mut self, key: Key, kind: &'static str, object: Value, rv: u64) {
        let ev = WatchEvent {
            resource: key.resource,
            namespace: key.namespace,
            kind,
            object,
            resource_version: rv,
        };
        self.history.push(ev.clone());
        if self.history.len() > HISTORY_LIMIT {
            let excess = self.history.len() - HISTORY_LIMIT;
            self.history.drain(..excess);
        }
        // No receiver is fine: nobody watches.
        let _ = self.events.send(ev);
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}
