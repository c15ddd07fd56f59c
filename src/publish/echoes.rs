//! The publisher's own writes, told apart when its watch sends them back.
//!
//! Every create, update and delete the publisher makes comes back as a watch event. A
//! sync on each would cost a LIST per write that finds nothing to do: at 1,000 plugins
//! starting at once, thousands of LISTs while the API server is busiest. An event that
//! is exactly a write the publisher made (same name and resourceVersion, or a delete of
//! the object it deleted) is skipped; anything else is somebody else's change (the
//! kubelet wiping the pool, an admin's edit) and triggers a sync.

use std::collections::HashSet;

use k8s_openapi::api::resource::v1::ResourceSlice;

/// Writes made and not yet seen coming back through the watch.
#[derive(Debug, Default)]
pub struct Echoes {
    /// (name, resourceVersion) of each object the server stored for us.
    stored: HashSet<(String, String)>,
    /// (name, uid) of each object we deleted.
    deleted: HashSet<(String, String)>,
}

fn name_and(s: &ResourceSlice, other: &Option<String>) -> Option<(String, String)> {
    Some((s.metadata.name.clone()?, other.clone()?))
}

impl Echoes {
    /// Records an object as the server returned it from our create or update.
    pub fn stored(&mut self, s: &ResourceSlice) {
        if let Some(k) = name_and(s, &s.metadata.resource_version) {
            self.stored.insert(k);
        }
    }

    /// Records an object we deleted (as listed before the delete).
    pub fn deleted(&mut self, s: &ResourceSlice) {
        if let Some(k) = name_and(s, &s.metadata.uid) {
            self.deleted.insert(k);
        }
    }

    /// Whether an added or modified object from the watch is one of our writes coming
    /// back (forgotten once seen).
    pub fn is_own_write(&mut self, seen: &ResourceSlice) -> bool {
        name_and(seen, &seen.metadata.resource_version).is_some_and(|k| self.stored.remove(&k))
    }

    /// Whether a deleted object from the watch is one we deleted (forgotten once seen).
    pub fn is_own_delete(&mut self, seen: &ResourceSlice) -> bool {
        name_and(seen, &seen.metadata.uid).is_some_and(|k| self.deleted.remove(&k))
    }

    /// Forgets every write: the watch relisted, so their events may never come, and the
    /// relist itself triggers a sync.
    pub fn forget(&mut self) {
        self.stored.clear();
        self.deleted.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slice(name: &str, rv: &str, uid: &str) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn our_write_coming_back_is_skipped_once() {
        let mut e = Echoes::default();
        e.stored(&slice("a", "10", "u1"));
        assert!(e.is_own_write(&slice("a", "10", "u1")));
        assert!(
            !e.is_own_write(&slice("a", "10", "u1")),
            "the same event twice is not ours twice"
        );
    }

    #[test]
    fn somebody_elses_change_of_our_slice_is_not_an_echo() {
        let mut e = Echoes::default();
        e.stored(&slice("a", "10", "u1"));
        assert!(!e.is_own_write(&slice("a", "11", "u1")));
        assert!(!e.is_own_write(&slice("b", "10", "u2")));
        assert!(
            !e.is_own_delete(&slice("a", "12", "u1")),
            "a delete we did not make"
        );
    }

    #[test]
    fn our_delete_coming_back_is_skipped_whatever_its_resource_version() {
        let mut e = Echoes::default();
        e.deleted(&slice("a", "10", "u1"));
        assert!(e.is_own_delete(&slice("a", "15", "u1")));
        assert!(!e.is_own_delete(&slice("a", "15", "u1")));
        e.deleted(&slice("a", "10", "u1"));
        assert!(
            !e.is_own_delete(&slice("a", "15", "u9")),
            "a new object under the same name"
        );
    }

    #[test]
    fn a_relist_forgets_every_pending_write() {
        let mut e = Echoes::default();
        e.stored(&slice("a", "10", "u1"));
        e.deleted(&slice("b", "11", "u2"));
        e.forget();
        assert!(!e.is_own_write(&slice("a", "10", "u1")));
        assert!(!e.is_own_delete(&slice("b", "11", "u2")));
    }

    #[test]
    fn objects_without_name_or_version_are_never_echoes() {
        let mut e = Echoes::default();
        let mut s = slice("a", "10", "u1");
        s.metadata.resource_version = None;
        e.stored(&s);
        assert!(!e.is_own_write(&s));
    }
}
