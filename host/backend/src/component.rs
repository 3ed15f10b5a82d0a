//! Component backends (`[backends.NAME] component = "app.wasm"`): the
//! components loaded for a generation ([`ComponentSet`], kept by the next
//! when the file and pool size did not change), a request served by one
//! in-process instead of over a socket, and the way out of a component:
//! its outgoing requests go to the configured backends through the same
//! [`Picked::send`] as every other request ([`ComponentOutbound`] for
//! [`Backends`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{Request, Response};
use inlay_config::{ComponentConfig, Config, ConfigIssue};
use inlay_core::ProxyError;
use inlay_core::body::ProxyBody;
use inlay_runtime::http_component::{ComponentOutbound, HttpComponent, NoOutbound};
use sha2::{Digest, Sha256};

use crate::Backends;
use crate::director::key_hash;

/// The components of one generation's backends, by backend name. Cheap to
/// clone.
#[derive(Clone, Debug, Default)]
pub struct ComponentSet {
    by_name: Arc<HashMap<String, Loaded>>,
}

/// One backend's component and what it was loaded from.
#[derive(Clone, Debug)]
struct Loaded {
    path: PathBuf,
    digest: [u8; 32],
    component: HttpComponent,
}

impl ComponentSet {
    /// No components.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads and loads the component of every component backend of
    /// `config`: one whose file (by its contents) and pool size are the
    /// same as in `previous` is kept, with its new settings; any other is
    /// compiled (on the blocking pool) and instantiated once. Every
    /// backend that does not load is an issue at its `component` key.
    pub async fn load(config: &Config, previous: &ComponentSet) -> Result<Self, Vec<ConfigIssue>> {
        let mut by_name = HashMap::new();
        let mut issues = Vec::new();
        for (name, backend) in &config.backends {
            let Some(c) = &backend.component else {
                continue;
            };
            match load_one(name, c, previous.by_name.get(name)).await {
                Ok(loaded) => {
                    by_name.insert(name.clone(), loaded);
                }
                Err(message) => issues.push(ConfigIssue {
                    path: format!("backends.{name}.component"),
                    message,
                }),
            }
        }
        match issues.is_empty() {
            true => Ok(Self {
                by_name: Arc::new(by_name),
            }),
            false => Err(issues),
        }
    }

    /// Backend `name`'s component.
    pub fn get(&self, name: &str) -> Option<&HttpComponent> {
        self.by_name.get(name).map(|l| &l.component)
    }

    /// Whether it has no components.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

async fn load_one(
    name: &str,
    c: &ComponentConfig,
    previous: Option<&Loaded>,
) -> Result<Loaded, String> {
    let path = c.path.clone();
    let bytes = tokio::fs::read(&path)
        .await
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let digest: [u8; 32] = Sha256::digest(&bytes).into();
    let settings = c.settings.clone();
    if let Some(old) = previous.filter(|old| {
        old.digest == digest
            && old.path == path
            && old.component.max_instances() == settings.max_instances
    }) {
        let component = old
            .component
            .with_settings(name, settings)
            .map_err(|e| e.to_string())?;
        if component.settings().read_only_dir != old.component.settings().read_only_dir {
            component.check().await.map_err(|e| e.to_string())?;
        }
        return Ok(Loaded {
            component,
            ..old.clone()
        });
    }
    let owned = name.to_owned();
    let at = path.clone();
    let component =
        tokio::task::spawn_blocking(move || HttpComponent::load(&owned, &at, &bytes, settings))
            .await
            .map_err(|e| format!("loading {} stopped: {e}", path.display()))?
            .map_err(|e| e.to_string())?;
    component.check().await.map_err(|e| e.to_string())?;
    tracing::info!(backend = name, path = %path.display(), "component loaded");
    Ok(Loaded {
        path,
        digest,
        component,
    })
}

impl ComponentOutbound for Backends {
    fn backend_for(&self, authority: &str) -> Option<String> {
        if self.exists(authority) {
            return Some(authority.to_owned());
        }
        self.iter()
            .find(|b| b.serves_authority(authority))
            .map(|b| b.name().to_owned())
    }

    fn send(
        &self,
        backend: &str,
        req: Request<ProxyBody>,
    ) -> BoxFuture<'static, Result<Response<ProxyBody>, ProxyError>> {
        let uri = req.uri().to_string();
        let picked = self.pick(backend, || key_hash(&uri));
        let backend = backend.to_owned();
        Box::pin(async move {
            match picked {
                Some(picked) => picked.send(req).await,
                None => Err(ProxyError::Internal(format!(
                    "backend {backend} is not configured"
                ))),
            }
        })
    }
}

/// The request a component gets: HTTP/1.1, its Host the backend's
/// `host_header`, or the client's, or the backend's name (which
/// [`HttpComponent::serve`] makes the URI's authority).
pub(crate) fn prepare(req: &mut Request<ProxyBody>, name: &str, host_header: Option<&str>) {
    *req.version_mut() = http::Version::HTTP_11;
    let host = host_header.or_else(|| {
        req.headers()
            .get(http::header::HOST)
            .is_none()
            .then_some(name)
    });
    if let Some(h) = host
        && let Ok(v) = http::HeaderValue::from_str(h)
    {
        req.headers_mut().insert(http::header::HOST, v);
    }
}

/// Serve `req` with `component`, its outgoing requests going to the
/// backends of `outbound` (none without), its response head due within
/// `first_byte` (a 504 after, as an origin's).
pub(crate) async fn serve(
    component: &HttpComponent,
    req: Request<ProxyBody>,
    outbound: Option<Backends>,
    first_byte: Duration,
) -> Result<Response<ProxyBody>, ProxyError> {
    let outbound: Arc<dyn ComponentOutbound> = match outbound {
        Some(b) => Arc::new(b),
        None => Arc::new(NoOutbound),
    };
    component
        .serve(req, outbound, first_byte)
        .await
        .map_err(|e| e.into_proxy_error(component.name()))
}
