//! The `keys:` section, and secrets read from the environment or a file.

use std::path::PathBuf;

use super::Validator;
use crate::config::raw::{RawKeys, S};
use crate::config::{Backend, KeysConfig, SecretSource, defaults};

impl Validator<'_> {
    pub(super) fn keys(&mut self, raw: RawKeys, backend: &Backend) -> KeysConfig {
        let prefix = match raw.prefix {
            None => defaults::PREFIX.to_owned(),
            Some(p) => {
                let ok = (1..=32).contains(&p.value.len())
                    && p.value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !ok {
                    self.push(
                        p.referenced,
                        format!(
                            "`keys.prefix` must be 1 to 32 letters, digits, `_` or `-`, got `{}`",
                            p.value
                        ),
                    );
                }
                p.value
            }
        };
        let pepper = self.secret(raw.pepper_env, raw.pepper_file, "keys.pepper");
        let previous_at = raw
            .previous_pepper_env
            .as_ref()
            .or(raw.previous_pepper_file.as_ref())
            .map(|p| p.referenced);
        let previous_pepper = self.secret(
            raw.previous_pepper_env,
            raw.previous_pepper_file,
            "keys.previous_pepper",
        );
        if let (Some(at), Backend::RedisCluster { .. }) = (previous_at, backend) {
            self.push(
                at,
                "`keys.previous_pepper_*` is not supported with `backend: redis-cluster`: keys under two peppers sit on different slots and cannot be read in one script; change the pepper without it (see docs/OPERATIONS.md)",
            );
        }
        KeysConfig {
            prefix,
            pepper,
            previous_pepper,
        }
    }

    pub(super) fn secret(
        &mut self,
        env: Option<S<String>>,
        file: Option<S<String>>,
        field: &str,
    ) -> Option<SecretSource> {
        match (env, file) {
            (Some(_), Some(file)) => {
                self.push(
                    file.referenced,
                    format!("set either `{field}_env` or `{field}_file`, not both"),
                );
                None
            }
            (Some(env), None) if env.value.is_empty() => {
                self.push(
                    env.referenced,
                    format!("`{field}_env` must name an environment variable"),
                );
                None
            }
            (Some(env), None) => Some(SecretSource::Env(env.value)),
            (None, Some(file)) if file.value.is_empty() => {
                self.push(file.referenced, format!("`{field}_file` must be a path"));
                None
            }
            (None, Some(file)) => Some(SecretSource::File(PathBuf::from(file.value))),
            (None, None) => None,
        }
    }
}
