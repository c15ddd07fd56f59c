//! The plugin's health endpoints on `--metrics-addr`: `/healthz` (the process serves
//! HTTP: liveness) and `/readyz` (the kubelet sockets are served and the last
//! ResourceSlice publication succeeded: readiness). The DaemonSet probes both.
//! `/metrics` serves the Prometheus exposition ([`crate::metrics`]) once the plugin has
//! set the scraper.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What readiness depends on; shared by the plugin's tasks.
/// Renders the metrics exposition at scrape time.
pub type Scraper = Box<dyn Fn() -> String + Send + Sync>;

#[derive(Default)]
pub struct Health {
    serving: AtomicBool,
    published: AtomicBool,
    publish_error: Mutex<Option<String>>,
    scraper: std::sync::OnceLock<Scraper>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("serving", &self.serving)
            .field("published", &self.published)
            .finish()
    }
}

impl Health {
    /// The kubelet's sockets (DRA and registration) are listening.
    pub fn set_serving(&self, on: bool) {
        self.serving.store(on, Ordering::Release);
    }

    /// Sets what `/metrics` serves (once; later calls are ignored).
    pub fn set_scraper(&self, scraper: Scraper) {
        let _ = self.scraper.set(scraper);
    }

    /// The outcome of the latest publication of the pool (also counted in the metrics).
    pub fn set_published(&self, result: Result<(), String>) {
        let ok = result.is_ok();
        crate::metrics::driver().published(ok);
        if let Ok(mut e) = self.publish_error.lock() {
            *e = result.err();
        }
        self.published.store(ok, Ordering::Release);
    }

    /// `Ok` when ready, else why not.
    pub fn ready(&self) -> Result<(), String> {
        if !self.serving.load(Ordering::Acquire) {
            return Err("not serving the kubelet yet".into());
        }
        if !self.published.load(Ordering::Acquire) {
            let why = self
                .publish_error
                .lock()
                .ok()
                .and_then(|e| e.clone())
                .unwrap_or_else(|| "not published yet".into());
            return Err(format!("ResourceSlices: {why}"));
        }
        Ok(())
    }
}

/// Answers one request. `/metrics` is OpenMetrics when the scraper accepts it
/// (Prometheus does), else the classic text format.
fn respond(health: &Health, path: &str, accept: &str) -> Response<Full<Bytes>> {
    if path == "/metrics" {
        let openmetrics = accept.contains("application/openmetrics-text");
        let mut r = match health.scraper.get() {
            Some(scrape) => {
                let om = scrape();
                let body = if openmetrics {
                    om
                } else {
                    crate::metrics::to_prometheus_text(&om)
                };
                Response::new(Full::new(Bytes::from(body)))
            }
            None => {
                let mut r = Response::new(Full::new(Bytes::from("not ready\n")));
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                return r;
            }
        };
        let ct = if openmetrics {
            crate::metrics::CONTENT_TYPE
        } else {
            crate::metrics::TEXT_CONTENT_TYPE
        };
        if let Ok(v) = hyper::header::HeaderValue::from_str(ct) {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        return r;
    }
    let (status, body) = match path {
        "/healthz" => (StatusCode::OK, "ok\n".to_string()),
        "/readyz" => match health.ready() {
            Ok(()) => (StatusCode::OK, "ok\n".to_string()),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

/// Binds `addr`; returns the bound address and the serving future (ends at shutdown).
pub async fn bind(
    addr: SocketAddr,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let serve = async move {
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                _ = &mut shutdown => return,
                a = listener.accept() => a,
            };
            let Ok((stream, _)) = accepted else {
                continue;
            };
            let h = health.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let accept = req
                        .headers()
                        .get(hyper::header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    let r = respond(&h, req.uri().path(), accept);
                    async move { Ok::<_, Infallible>(r) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    };
    Ok((local, serve))
}

/// Parses `--metrics-addr`: `host:port`, or `:port` for all addresses.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse()
        .map_err(|e| format!("--metrics-addr {s:?}: {e} (want host:port or :port)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ready only when serving and published; a publication error says why.
    #[test]
    fn readiness_needs_sockets_and_slices() {
        let h = Health::default();
        assert_eq!(respond(&h, "/healthz", "").status(), StatusCode::OK);
        assert_eq!(
            respond(&h, "/readyz", "").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        h.set_serving(true);
        assert!(h.ready().unwrap_err().contains("not published"));
        h.set_published(Err("403 Forbidden".into()));
        assert!(h.ready().unwrap_err().contains("403"));
        h.set_published(Ok(()));
        assert_eq!(respond(&h, "/readyz", "").status(), StatusCode::OK);
        assert_eq!(
            respond(&h, "/metrics", "").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        h.set_scraper(Box::new(|| "# EOF\n".to_string()));
        assert_eq!(respond(&h, "/metrics", "").status(), StatusCode::OK);
        assert_eq!(respond(&h, "/nope", "").status(), StatusCode::NOT_FOUND);
        assert_eq!(parse_addr(":9464").unwrap().port(), 9464);
        assert!(parse_addr("9464").is_err());
    }
}
