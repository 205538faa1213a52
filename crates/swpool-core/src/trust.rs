//! Trust, as the rest of sw-pool sees it: the `swpool-trust` crate (keys, signatures, the policy
//! check), plus what depends on sw-pool's configuration: the default key directories and the policy
//! from `require_signature`.

use std::path::PathBuf;

pub use swpool_trust::*;

use crate::config::{Config, EnvVar, Environment, Origin};

/// The trusted-keys directories: `$SW_POOL_TRUSTED_KEYS` (`:`-separated) if set, else
/// `/etc/sw-pool/trusted-keys` and `~/.config/sw-pool/trusted-keys`.
pub fn default_dirs(env: &Environment) -> Vec<PathBuf> {
    if let Some(v) = env.get_os(EnvVar::TrustedKeys) {
        return std::env::split_paths(v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
    }
    let mut d = vec![PathBuf::from(keys::SYSTEM_TRUSTED_KEYS)];
    if let Some(u) = env.user_config_dir() {
        d.push(u.join("sw-pool/trusted-keys"));
    }
    d
}

/// The policy `load`, `mount` and the TaskProlog enforce, from `require_signature` and the keys
/// found ([`TrustPolicy::new`]: required by default as soon as a trusted key is installed).
pub fn policy_from_config(cfg: &Config, keys: TrustedKeys) -> TrustPolicy {
    let s = &cfg.require_signature;
    let explicit = (s.origin != Origin::Default).then(|| (s.value, s.origin.to_string()));
    TrustPolicy::new(explicit, keys)
}
