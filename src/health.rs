//! The plugin's health endpoints on `--metrics-addr`: `/healthz` (the process serves
//! HTTP: liveness) and `/readyz` (the kubelet sockets are served and the last
//! ResourceSlice publication succeeded: readiness). The DaemonSet probes both.
//! `/metrics` serves the Prometheus exposition ([`crate::metrics`]) once the plugin has
//! set the scraper.
//!
//! A scrape reads the checkpoint and the claims' regions and calls NVML, any of which
//! can block (a hung GPU can hold an NVML call for minutes). So it runs on a blocking
//! thread, never on the runtime's workers (which also serve the kubelet's gRPC), and
//! the answer waits at most [`SCRAPE_TIMEOUT`]: past it, or while an earlier scrape is
//! still running, `/metrics` answers with the last complete exposition (header
//! `X-Tessera-Scrape: stale`), or 503 when there is none yet. At most one scrape runs
//! at a time, so a hung call never piles up threads.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Renders the metrics exposition at scrape time (blocking: file reads, NVML).
pub type Scraper = Box<dyn Fn() -> String + Send + Sync>;

/// How long `/metrics` waits for a scrape before answering with the last one.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// What readiness depends on, and the metrics scraper; shared by the plugin's tasks.
pub struct Health {
    serving: AtomicBool,
    published: AtomicBool,
    publish_error: Mutex<Option<String>>,
    scraper: std::sync::OnceLock<Scraper>,
    scrape_timeout: Duration,
    /// A scrape is running on a blocking thread.
    scraping: AtomicBool,
    /// The last complete exposition.
    last_scrape: Mutex<Option<String>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            serving: AtomicBool::new(false),
            published: AtomicBool::new(false),
            publish_error: Mutex::new(None),
            scraper: std::sync::OnceLock::new(),
            scrape_timeout: SCRAPE_TIMEOUT,
            scraping: AtomicBool::new(false),
            last_scrape: Mutex::new(None),
        }
    }
}

/// What `/metrics` got from the scraper.
#[derive(Debug, PartialEq, Eq)]
enum Scrape {
    /// A scrape made for this request.
    Fresh(String),
    /// The last complete one: this request's timed out, or another was running.
    Stale(String),
    /// No scraper yet, or none completed and this one did not in time.
    Unavailable(&'static str),
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

    /// `Health` whose scrapes wait at most `timeout` (tests).
    pub fn with_scrape_timeout(timeout: Duration) -> Self {
        Health {
            scrape_timeout: timeout,
            ..Health::default()
        }
    }

    fn last_scrape(&self) -> Option<String> {
        self.last_scrape
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs the scraper on a blocking thread, waiting at most the scrape timeout. The
    /// thread keeps running past the timeout and stores its result when it ends.
    async fn scrape(self: &Arc<Self>) -> Scrape {
        if self.scraper.get().is_none() {
            return Scrape::Unavailable("not ready");
        }
        let stale = |why| match self.last_scrape() {
            Some(s) => Scrape::Stale(s),
            None => Scrape::Unavailable(why),
        };
        if self.scraping.swap(true, Ordering::AcqRel) {
            return stale("an earlier scrape is still running");
        }
        let me = self.clone();
        let task = tokio::task::spawn_blocking(move || {
            let text = me.scraper.get().map(|scrape| scrape());
            if let Some(t) = &text {
                *me.last_scrape.lock().unwrap_or_else(|p| p.into_inner()) = Some(t.clone());
            }
            me.scraping.store(false, Ordering::Release);
            text
        });
        match tokio::time::timeout(self.scrape_timeout, task).await {
            Ok(Ok(Some(text))) => Scrape::Fresh(text),
            Ok(Ok(None)) => Scrape::Unavailable("not ready"),
            Ok(Err(e)) => {
                // The scraper panicked: its thread never cleared the flag.
                self.scraping.store(false, Ordering::Release);
                tracing::warn!(error = %e, "metrics scrape failed");
                stale("the scrape failed")
            }
            Err(_) => {
                tracing::warn!(
                    timeout = ?self.scrape_timeout,
                    "metrics scrape timed out (a hung NVML call?): serving the last one"
                );
                stale("the scrape timed out")
            }
        }
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
async fn respond(health: &Arc<Health>, path: &str, accept: &str) -> Response<Full<Bytes>> {
    if path == "/metrics" {
        let openmetrics = accept.contains("application/openmetrics-text");
        let (om, stale) = match health.scrape().await {
            Scrape::Fresh(s) => (s, false),
            Scrape::Stale(s) => (s, true),
            Scrape::Unavailable(why) => {
                let mut r = Response::new(Full::new(Bytes::from(format!("{why}\n"))));
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                return r;
            }
        };
        let body = if openmetrics {
            om
        } else {
            crate::metrics::to_prometheus_text(&om)
        };
        let mut r = Response::new(Full::new(Bytes::from(body)));
        let ct = if openmetrics {
            crate::metrics::CONTENT_TYPE
        } else {
            crate::metrics::TEXT_CONTENT_TYPE
        };
        if let Ok(v) = hyper::header::HeaderValue::from_str(ct) {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        if stale {
            r.headers_mut().insert(
                "x-tessera-scrape",
                hyper::header::HeaderValue::from_static("stale"),
            );
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
                    let h = h.clone();
                    async move {
                        let accept = req
                            .headers()
                            .get(hyper::header::ACCEPT)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("");
                        Ok::<_, Infallible>(respond(&h, req.uri().path(), accept).await)
                    }
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
    #[tokio::test]
    async fn readiness_needs_sockets_and_slices() {
        let h = Arc::new(Health::default());
        assert_eq!(respond(&h, "/healthz", "").await.status(), StatusCode::OK);
        assert_eq!(
            respond(&h, "/readyz", "").await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        h.set_serving(true);
        assert!(h.ready().unwrap_err().contains("not published"));
        h.set_published(Err("403 Forbidden".into()));
        assert!(h.ready().unwrap_err().contains("403"));
        h.set_published(Ok(()));
        assert_eq!(respond(&h, "/readyz", "").await.status(), StatusCode::OK);
        assert_eq!(
            respond(&h, "/metrics", "").await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        h.set_scraper(Box::new(|| "# EOF\n".to_string()));
        assert_eq!(respond(&h, "/metrics", "").await.status(), StatusCode::OK);
        assert_eq!(
            respond(&h, "/nope", "").await.status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(parse_addr(":9464").unwrap().port(), 9464);
        assert!(parse_addr("9464").is_err());
    }

    /// A scrape that hangs (a stuck NVML call) does not hold the answer past the
    /// timeout, and never runs twice at once: the first scrape's exposition is served
    /// again, marked stale, while the second hangs, and the runtime's worker stays
    /// free (a one-worker runtime still answers `/healthz` meanwhile).
    #[tokio::test(flavor = "current_thread")]
    async fn a_hung_scrape_serves_the_last_exposition() {
        use std::sync::atomic::AtomicU32;
        let calls = Arc::new(AtomicU32::new(0));
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let h = Arc::new(Health::with_scrape_timeout(Duration::from_millis(200)));
        let c = calls.clone();
        h.set_scraper(Box::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            if n > 0 {
                // Hung until the test releases it.
                let _ = release_rx.lock().unwrap().recv();
            }
            format!("tessera_scrape_number {n}\n# EOF\n")
        }));
        let body = |r: Response<Full<Bytes>>| async move {
            use http_body_util::BodyExt;
            let stale = r.headers().contains_key("x-tessera-scrape");
            let b = r.into_body().collect().await.unwrap().to_bytes();
            (stale, String::from_utf8(b.to_vec()).unwrap())
        };
        let (stale, text) = body(respond(&h, "/metrics", "").await).await;
        assert!(!stale && text.contains("tessera_scrape_number 0"), "{text}");
        let t = std::time::Instant::now();
        let r = respond(&h, "/metrics", "").await;
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(r.status(), StatusCode::OK);
        let (stale, text) = body(r).await;
        assert!(stale && text.contains("tessera_scrape_number 0"), "{text}");
        // Still hung: served at once, without a second scraper call.
        let (stale, _) = body(respond(&h, "/metrics", "").await).await;
        assert!(stale);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(respond(&h, "/healthz", "").await.status(), StatusCode::OK);
        release_tx.send(()).unwrap();
        // Once it ends, its exposition is the last one.
        for _ in 0..100 {
            if !h.scraping.load(Ordering::Acquire) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            h.last_scrape().as_deref(),
            Some("tessera_scrape_number 1\n# EOF\n")
        );
    }
}
