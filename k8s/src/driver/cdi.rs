//! A prepared claim's CDI spec: the same builder as `gpuslice cdi` (`gpuslice_cdi`),
//! one file per claim in the CDI directory, root's alone when it carries a join secret, with
//! its files (`/etc/ld.so.preload`, the settings file) in a root-only directory beside it.

use super::{slice_name, Driver};
use crate::config::NvidiaCdiName;
use crate::error::Error;
use crate::nvml::Gpu;
use gpuslice_ledger::secret::{Secret, SECRET_VAR};
use std::path::PathBuf;

impl Driver {
    pub(super) fn spec_path(&self, uid: &str) -> PathBuf {
        let kind = self.cfg.cdi_kind.replace('/', "-");
        self.cfg
            .cdi_dir
            .join(format!("{kind}_{}.json", slice_name(uid)))
    }

    pub(super) fn nvidia_cdi_id(&self, g: &Gpu) -> Option<String> {
        let name = match self.cfg.nvidia_cdi_name {
            NvidiaCdiName::Uuid => g.uuid.clone(),
            NvidiaCdiName::Index => g.index.to_string(),
            NvidiaCdiName::None => return None,
        };
        Some(format!("{}={name}", self.cfg.nvidia_cdi_kind))
    }

    pub(super) fn write_spec(&self, uid: &str, secret: Option<&Secret>) -> Result<(), Error> {
        let name = slice_name(uid);
        let mut env = vec![("GPUSLICE_SLICE".to_string(), name.clone())];
        if let Some(s) = secret {
            env.push((SECRET_VAR.to_string(), s.expose().to_string()));
        }
        let path = self.spec_path(uid);
        // The files first: the runtime never reads a spec whose files are missing.
        let files = std::fs::create_dir_all(&self.cfg.cdi_dir)
            .and_then(|()| gpuslice_cdi::write_files(&path, &env))
            .map_err(|source| Error::Io {
                what: "writing the claim's /etc/ld.so.preload and settings file",
                path: gpuslice_cdi::files_dir(&path),
                source,
            })?;
        let spec = gpuslice_cdi::spec(
            &self.cfg.cdi_kind,
            &name,
            &env,
            &self.cfg.library.to_string_lossy(),
            &self.cfg.runtime_dir.to_string_lossy(),
            Some(&files),
        );
        let text = serde_json::to_string_pretty(&spec).expect("a JSON value serializes") + "\n";
        if std::fs::read(&path).is_ok_and(|b| b == text.as_bytes()) {
            return Ok(());
        }
        // A spec with a secret is root's alone (the container runtime reads it as root).
        let write = if secret.is_some() {
            gpuslice_cdi::write_private_atomically
        } else {
            gpuslice_cdi::write_atomically
        };
        std::fs::create_dir_all(&self.cfg.cdi_dir)
            .and_then(|()| write(&path, text.as_bytes()))
            .map_err(|source| Error::Io {
                what: "writing the CDI spec",
                path,
                source,
            })
    }
}
