//! Operator slices' join secrets, the ledger's side: which secret a slice name has, and
//! keeping one name to one secret when an operator slice is made (`secret.rs` holds the
//! secrets and their root-only store).

use super::Ledger;
use crate::error::LedgerError;
use crate::secret::{Secret, Store, SECRET_VAR};

/// Whether slice record `s` is one a process can join by name (not a private one).
fn named(s: &crate::layout::Slice) -> bool {
    use core::sync::atomic::Ordering::SeqCst;
    s.state.load(SeqCst) == crate::layout::STATE_ACTIVE && s.private.load(SeqCst) == 0
}

impl Ledger {
    /// The join secret of slice `name` (node mode; `None` for a slice without one, and always
    /// in personal mode). Reads the root-only file: root only.
    pub fn slice_secret(&self, name: &str) -> Result<Option<Secret>, LedgerError> {
        if !self.is_node() {
            return Ok(None);
        }
        Ok(Store::load(self.dir())?.get(name).cloned())
    }

    /// Before operator slice `name` is created (caller holds the lock): make the stored secret
    /// of `name` be `secret`. Another operator slice of that name (on another device) must have
    /// the same secret, or none with none: one name, one secret. A secret left by slices that
    /// are gone is replaced. Returns the store as it was when it was changed (to put back if
    /// the creation fails).
    pub(crate) fn set_secret_for_new_slice_locked(
        &self,
        name: &str,
        secret: Option<&Secret>,
    ) -> Result<Option<Store>, LedgerError> {
        use core::sync::atomic::Ordering::SeqCst;
        if !self.is_node() {
            if secret.is_some() {
                return Err(LedgerError::BadSecret(format!(
                    "slice {name:?}: join secrets apply to node mode only (a runtime directory \
                     of root's node monitor); in a personal runtime directory every process is \
                     its one user's, so there is nothing to keep out (see docs/security.md)"
                )));
            }
            return Ok(None);
        }
        let mut store = Store::load(self.dir())?;
        let old = store.get(name).cloned();
        let operator_elsewhere = self
            .slices()
            .iter()
            .any(|s| named(s) && s.operator_defined.load(SeqCst) != 0 && s.name.get() == name);
        if operator_elsewhere {
            let same = match (&old, secret) {
                (None, None) => true,
                (Some(a), Some(b)) => a.matches(b.expose()),
                _ => false,
            };
            if same {
                return Ok(None);
            }
            return Err(LedgerError::BadSecret(format!(
                "an operator slice named {name:?} exists already {}; one name has one secret \
                 on every device: {}",
                if old.is_some() {
                    "with a secret"
                } else {
                    "without a secret"
                },
                if old.is_some() {
                    "give the same --secret-file"
                } else {
                    "give no secret, or remove the slice first"
                }
            )));
        }
        let before = store.clone();
        if store.set(name, secret.cloned()) {
            store.save(self.dir())?;
            return Ok(Some(before));
        }
        Ok(None)
    }

    /// Refuse a non-root process (uid `uid`) that names a slice with a secret in `names`
    /// without giving that secret (caller holds the lock). Root joins without it.
    pub(crate) fn check_join_secret_locked(
        &self,
        uid: u32,
        names: &[&str],
        given: Option<&str>,
    ) -> Result<(), LedgerError> {
        if uid == 0 || names.is_empty() || !self.is_node() {
            return Ok(());
        }
        let store = Store::load(self.dir()).map_err(|e| {
            LedgerError::BadSecret(format!(
                "cannot check the secrets of the node's slices ({e}); ask the operator"
            ))
        })?;
        for name in names {
            let Some(s) = store.get(name) else {
                continue;
            };
            let why = match given {
                None => format!(
                    "{SECRET_VAR} is not set (the slice's operator hands it out: the claim's \
                     CDI device in Kubernetes, the file of `gpuslice slice create \
                     --secret-file` otherwise)"
                ),
                Some(g) if s.matches(g) => continue,
                Some(_) => format!("{SECRET_VAR} does not match"),
            };
            return Err(LedgerError::BadSecret(format!(
                "slice {name:?} requires its secret: {why}"
            )));
        }
        Ok(())
    }

    /// Forget the secrets of names no slice record carries any more (caller holds the lock).
    /// A slice removed while processes use it keeps its secret until its last one is gone.
    /// Best effort: a secret left behind only keeps a new slice of that name closed.
    pub(crate) fn prune_secrets_locked(&self) {
        if !self.is_node() || !self.writable() {
            return;
        }
        let Ok(mut store) = Store::load(self.dir()) else {
            return;
        };
        let live: Vec<String> = self
            .slices()
            .iter()
            .filter(|s| named(s))
            .map(|s| s.name.get())
            .collect();
        if store.retain(|n| live.iter().any(|l| l == n)) {
            let _ = store.save(self.dir());
        }
    }
}
