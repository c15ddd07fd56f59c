//! The plugin's health endpoints on `--metrics-addr`: `/healthz` (the process serves
//! HTTP: liveness) and `/readyz` (the kubelet sockets are served, the last
//! ResourceSlice publication succeeded and the kubelet has registered the plugin:
//! readiness, which a DaemonSet's rolling update waits for before removing the old pod). The DaemonSet probes both.
//! `/metrics` serves the Prometheus exposition ([`crate::telemetry::metrics`]) once the plugin has
//! set the scraper.
//!
//! A scrape reads the checkpoint and the claims' regions and calls NVML, any of which
//! can block (a hung GPU can hold an NVML call for minutes). So it runs on a thread of
//! its own, never on the runtime's workers (which also serve the kubelet's gRPC), and
//! detached: a hung one never holds up the runtime's shutdown. At most one scrape runs
//! at a time; a request arriving while one runs waits for that one. Each request waits
//! at most [`SCRAPE_TIMEOUT`]: past it, or when the scrape failed (the scraper
//! panicked), `/metrics` answers with the last complete exposition (header
//! `X-Tessera-Scrape: stale`) if it is at most [`MAX_STALE_FACTOR`] timeouts old, else
//! 503. Every answer carries `tessera_metrics_scrape_stale` (1 on a repeat) and
//! `tessera_metrics_last_scrape_success_timestamp_seconds` (when the exposition
//! served was made), which Prometheus sees where it ignores the header.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Renders the metrics exposition at scrape time (blocking: file reads, NVML).
pub type Scraper = Box<dyn Fn() -> String + Send + Sync>;

/// How long `/metrics` waits for a scrape before answering with the last one.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// A stale exposition is served while at most this many scrape timeouts old; older,
/// `/metrics` answers 503 (Prometheus marks the target down instead of freezing values
/// and bringing back the series of claims unprepared since).
pub const MAX_STALE_FACTOR: u32 = 2;

/// The result of the scrape in flight: `None` until it ends; the sender drops without
/// a value when the scraper panics.
type InFlight = watch::Receiver<Option<Exposition>>;

/// What readiness depends on, and the metrics scraper; shared by the plugin's tasks.
pub struct Health {
    serving: AtomicBool,
    /// The kubelet's last `NotifyRegistrationStatus`: `None` until it called.
    registered: Mutex<Option<Result<(), String>>>,
    published: AtomicBool,
    publish_error: Mutex<Option<String>>,
    scraper: std::sync::OnceLock<Scraper>,
    scrape_timeout: Duration,
    /// The scrape running on its thread, if any; cleared by that thread when it ends.
    in_flight: Mutex<Option<InFlight>>,
    /// The last complete exposition.
    last_scrape: Mutex<Option<Exposition>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            serving: AtomicBool::new(false),
            registered: Mutex::new(None),
            published: AtomicBool::new(false),
            publish_error: Mutex::new(None),
            scraper: std::sync::OnceLock::new(),
            scrape_timeout: SCRAPE_TIMEOUT,
            in_flight: Mutex::new(None),
            last_scrape: Mutex::new(None),
        }
    }
}

/// One complete exposition and when it was made.
#[derive(Debug, Clone, PartialEq)]
struct Exposition {
    text: String,
    /// For its age.
    at: Instant,
    /// Unix seconds, for `tessera_metrics_last_scrape_success_timestamp_seconds`.
    unix: f64,
}

/// What `/metrics` got from the scraper.
#[derive(Debug, PartialEq)]
enum Scrape {
    /// The scrape this request waited for (its own or one already running).
    Fresh(Exposition),
    /// The last complete one: the scrape timed out or failed.
    Stale(Exposition),
    /// No scraper yet, or no recent enough exposition.
    Unavailable(String),
}

/// Clears [`Health::in_flight`] when the scrape thread ends, returning or panicking,
/// unless a later scrape took the slot already.
struct ClearInFlight(Arc<Health>, InFlight);

impl Drop for ClearInFlight {
    fn drop(&mut self) {
        let mut slot = lock(&self.0.in_flight);
        if slot.as_ref().is_some_and(|rx| rx.same_channel(&self.1)) {
            *slot = None;
        }
    }
}

/// Locks, ignoring poisoning (every value here is replaced whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("serving", &self.serving)
            .field("registered", &self.registered)
            .field("published", &self.published)
            .finish()
    }
}

impl Health {
    /// The kubelet's sockets (DRA and registration) are listening.
    pub fn set_serving(&self, on: bool) {
        self.serving.store(on, Ordering::Release);
    }

    /// What the kubelet reported of the registration (`NotifyRegistrationStatus`).
    pub fn set_registered(&self, result: Result<(), String>) {
        if let Ok(mut r) = self.registered.lock() {
            *r = Some(result);
        }
    }

    /// Sets what `/metrics` serves (once; later calls are ignored).
    pub fn set_scraper(&self, scraper: Scraper) {
        let _ = self.scraper.set(scraper);
    }

    /// The outcome of the latest publication of the pool (also counted in the metrics).
    pub fn set_published(&self, result: Result<(), String>) {
        let ok = result.is_ok();
        crate::telemetry::metrics::driver().published(ok);
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

    fn last_scrape(&self) -> Option<Exposition> {
        lock(&self.last_scrape).clone()
    }

    /// The scrape in flight, or a new one started on a detached thread. The thread
    /// stores its exposition as the last one, and clears the in-flight slot when it
    /// ends, even by a panic.
    fn join_or_start_scrape(self: &Arc<Self>) -> InFlight {
        let mut slot = lock(&self.in_flight);
        // A scrape that has ended but not yet cleared the slot is not joined: this
        // request gets a scrape that started after it arrived.
        if let Some(rx) = slot.as_ref().filter(|rx| rx.borrow().is_none()) {
            return rx.clone();
        }
        let (tx, rx) = watch::channel(None);
        let me = self.clone();
        let mine = rx.clone();
        let spawned = std::thread::Builder::new()
            .name("metrics-scrape".into())
            .spawn(move || {
                let _clear = ClearInFlight(me.clone(), mine);
                if let Some(scrape) = me.scraper.get() {
                    let text = scrape();
                    let exp = Exposition {
                        text,
                        at: Instant::now(),
                        unix: crate::clock::since_epoch().as_secs_f64(),
                    };
                    *lock(&me.last_scrape) = Some(exp.clone());
                    tx.send_replace(Some(exp));
                }
            });
        match spawned {
            // Set under the lock, so the thread's clear comes after it.
            Ok(_) => *slot = Some(rx.clone()),
            Err(e) => tracing::warn!(error = %e, "cannot start a metrics scrape thread"),
        }
        rx
    }

    /// Waits at most the scrape timeout for the scrape in flight (or a new one).
    async fn scrape(self: &Arc<Self>) -> Scrape {
        if self.scraper.get().is_none() {
            return Scrape::Unavailable("not ready".into());
        }
        let mut rx = self.join_or_start_scrape();
        let waited = tokio::time::timeout(self.scrape_timeout, rx.wait_for(Option::is_some)).await;
        let why = match waited {
            Ok(Ok(done)) => match done.clone() {
                Some(exp) => return Scrape::Fresh(exp),
                None => "the scrape failed",
            },
            Ok(Err(_)) => {
                tracing::warn!("metrics scrape failed (the scraper panicked)");
                "the scrape failed"
            }
            Err(_) => {
                tracing::warn!(
                    timeout = ?self.scrape_timeout,
                    "metrics scrape timed out (a hung NVML call?)"
                );
                "the scrape timed out"
            }
        };
        let max_age = self.scrape_timeout * MAX_STALE_FACTOR;
        match self.last_scrape() {
            Some(exp) if exp.at.elapsed() <= max_age => Scrape::Stale(exp),
            Some(exp) => Scrape::Unavailable(format!(
                "{why}, and the last complete one is {:.0?} old (more than {max_age:?})",
                exp.at.elapsed()
            )),
            None => Scrape::Unavailable(why.into()),
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
        // Only a plugin the kubelet has registered can prepare: a DaemonSet's rolling
        // update removes the old pod once the new one is Ready, and prepares in between
        // would find no plugin (seen on the real kubelet 1.34: "connection refused" on the
        // old pod's socket, the claim's pod started 78 s later).
        match self.registered.lock().ok().and_then(|r| r.clone()) {
            None => return Err("not registered with the kubelet yet".into()),
            Some(Err(e)) => return Err(format!("the kubelet refused the registration: {e}")),
            Some(Ok(())) => {}
        }
        Ok(())
    }
}

/// Answers one request. `/metrics` is OpenMetrics when the scraper accepts it
/// (Prometheus does), else the classic text format.
async fn respond(health: &Arc<Health>, path: &str, accept: &str) -> Response<Full<Bytes>> {
    if path == "/metrics" {
        let openmetrics = accept.contains("application/openmetrics-text");
        let (exp, stale) = match health.scrape().await {
            Scrape::Fresh(e) => (e, false),
            Scrape::Stale(e) => (e, true),
            Scrape::Unavailable(why) => {
                let mut r = Response::new(Full::new(Bytes::from(format!("{why}\n"))));
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                return r;
            }
        };
        let om = with_scrape_status(&exp.text, stale, exp.unix);
        let body = if openmetrics {
            om
        } else {
            crate::telemetry::metrics::to_prometheus_text(&om)
        };
        let mut r = Response::new(Full::new(Bytes::from(body)));
        let ct = if openmetrics {
            crate::telemetry::metrics::CONTENT_TYPE
        } else {
            crate::telemetry::metrics::TEXT_CONTENT_TYPE
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

/// `om` with the scrape's own gauges added before `# EOF`: whether it is a repeat, and
/// when it was made. Deterministic.
fn with_scrape_status(om: &str, stale: bool, unix: f64) -> String {
    let body = om.strip_suffix("# EOF\n").unwrap_or(om);
    format!(
        "{body}# HELP tessera_metrics_scrape_stale Whether this exposition repeats an earlier scrape (1) because the current one timed out or failed.\n\
         # TYPE tessera_metrics_scrape_stale gauge\n\
         tessera_metrics_scrape_stale {}\n\
         # HELP tessera_metrics_last_scrape_success_timestamp_seconds When the exposition served was scraped (unix seconds).\n\
         # TYPE tessera_metrics_last_scrape_success_timestamp_seconds gauge\n\
         tessera_metrics_last_scrape_success_timestamp_seconds {unix:.3}\n\
         # EOF\n",
        u8::from(stale)
    )
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

    /// Ready only when serving, published and registered; an error says why.
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
        assert!(h.ready().unwrap_err().contains("not registered"));
        h.set_registered(Err("version mismatch".into()));
        assert!(
            h.ready()
                .unwrap_err()
                .contains("refused the registration: version mismatch")
        );
        h.set_registered(Ok(()));
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

    async fn body(r: Response<Full<Bytes>>) -> (bool, String) {
        use http_body_util::BodyExt;
        let stale = r.headers().contains_key("x-tessera-scrape");
        let b = r.into_body().collect().await.unwrap().to_bytes();
        (stale, String::from_utf8(b.to_vec()).unwrap())
    }

    /// A scraper that hangs from its second call on until `release` receives, and then
    /// panics if `panic_after_release`.
    fn hanging_scraper(
        panic_after_release: bool,
    ) -> (Scraper, Arc<AtomicU32>, std::sync::mpsc::Sender<()>) {
        let calls = Arc::new(AtomicU32::new(0));
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let c = calls.clone();
        let scraper: Scraper = Box::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            if n == 1 {
                let _ = release_rx.lock().unwrap().recv();
                if panic_after_release {
                    panic!("scraper blew up");
                }
            }
            format!("tessera_scrape_number {n}\n# EOF\n")
        });
        (scraper, calls, release_tx)
    }

    async fn wait_idle(h: &Health) {
        for _ in 0..200 {
            if lock(&h.in_flight).is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the scrape thread never ended");
    }

    use std::sync::atomic::AtomicU32;

    /// A scrape that hangs (a stuck NVML call) does not hold the answer past the
    /// timeout: the first scrape's exposition is served
    /// again, marked stale (header and gauge), while the second hangs; the runtime's
    /// worker stays free: a one-worker runtime answers `/healthz` while a `/metrics`
    /// request waits on the hung scrape.
    #[tokio::test(flavor = "current_thread")]
    async fn a_hung_scrape_serves_the_last_exposition() {
        let (scraper, calls, release) = hanging_scraper(false);
        // Timeouts of seconds: a loaded machine's scheduling delays (hundreds of ms)
        // stay far inside the bounds below.
        let h = Arc::new(Health::with_scrape_timeout(Duration::from_secs(2)));
        h.set_scraper(scraper);
        let (stale, text) =
            body(respond(&h, "/metrics", "application/openmetrics-text").await).await;
        assert!(!stale && text.contains("tessera_scrape_number 0"), "{text}");
        assert!(text.contains("tessera_metrics_scrape_stale 0\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        let first_at = h.last_scrape().unwrap().unix;
        let t = Instant::now();
        let waiting = tokio::spawn({
            let h = h.clone();
            async move { respond(&h, "/metrics", "").await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Meanwhile, on the same (only) worker:
        assert_eq!(respond(&h, "/healthz", "").await.status(), StatusCode::OK);
        assert!(
            !waiting.is_finished(),
            "the /metrics request is still waiting"
        );
        let r = waiting.await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert_eq!(r.status(), StatusCode::OK);
        let (stale, text) = body(r).await;
        assert!(stale && text.contains("tessera_scrape_number 0"), "{text}");
        assert!(text.contains("tessera_metrics_scrape_stale 1\n"), "{text}");
        assert!(
            text.contains(&format!(
                "tessera_metrics_last_scrape_success_timestamp_seconds {first_at:.3}\n"
            )),
            "{text}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        release.send(()).unwrap();
        // Once it ends, its exposition is the last one.
        wait_idle(&h).await;
        assert_eq!(
            h.last_scrape().map(|e| e.text).as_deref(),
            Some("tessera_scrape_number 1\n# EOF\n")
        );
    }

    /// Regression (a stale reply was served however old, freezing the values): once
    /// the last complete exposition is older than `MAX_STALE_FACTOR` timeouts, a scrape
    /// that times out answers 503.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stale_exposition_expires() {
        let (scraper, calls, release) = hanging_scraper(false);
        let timeout = Duration::from_secs(1);
        let h = Arc::new(Health::with_scrape_timeout(timeout));
        h.set_scraper(scraper);
        assert_eq!(respond(&h, "/metrics", "").await.status(), StatusCode::OK);
        let (stale, _) = body(respond(&h, "/metrics", "").await).await;
        assert!(stale, "within the bound the last one is served");
        tokio::time::sleep(timeout * MAX_STALE_FACTOR).await;
        let r = respond(&h, "/metrics", "").await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        let (_, why) = body(r).await;
        assert!(why.contains("timed out") && why.contains("old"), "{why}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "both waited on the hung scrape"
        );
        release.send(()).unwrap();
    }

    /// Regression (the flag stayed set when the scraper panicked after its request
    /// timed out, so `/metrics` served the old exposition for good): a panicking
    /// scrape ends its in-flight state, and the next request scrapes afresh.
    #[tokio::test(flavor = "current_thread")]
    async fn a_panicking_scrape_does_not_block_later_ones() {
        let (scraper, calls, release) = hanging_scraper(true);
        let h = Arc::new(Health::with_scrape_timeout(Duration::from_secs(1)));
        h.set_scraper(scraper);
        assert_eq!(respond(&h, "/metrics", "").await.status(), StatusCode::OK);
        let (stale, _) = body(respond(&h, "/metrics", "").await).await;
        assert!(stale, "timed out");
        release.send(()).unwrap();
        wait_idle(&h).await;
        let (stale, text) = body(respond(&h, "/metrics", "").await).await;
        assert!(!stale && text.contains("tessera_scrape_number 2"), "{text}");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    /// Regression (a request arriving during a scrape got the previous exposition at
    /// once, or 503 before the first): concurrent requests share the scrape in flight
    /// and all get its fresh result.
    #[tokio::test(flavor = "current_thread")]
    async fn overlapping_requests_share_the_scrape_in_flight() {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let h = Arc::new(Health::with_scrape_timeout(Duration::from_secs(5)));
        h.set_scraper(Box::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(200));
            format!("tessera_scrape_number {n}\n# EOF\n")
        }));
        let (a, b) = tokio::join!(respond(&h, "/metrics", ""), respond(&h, "/metrics", ""));
        for r in [a, b] {
            assert_eq!(r.status(), StatusCode::OK);
            let (stale, text) = body(r).await;
            assert!(!stale && text.contains("tessera_scrape_number 0"), "{text}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    /// Regression (a hung scrape on a blocking task kept the runtime's drop, so the
    /// plugin's exit after SIGTERM, waiting forever): the runtime drops at once while
    /// the scraper is still hung.
    #[test]
    fn a_hung_scrape_does_not_hold_the_runtime_shutdown() {
        let (scraper, _calls, release) = hanging_scraper(false);
        let h = Arc::new(Health::with_scrape_timeout(Duration::from_secs(1)));
        h.set_scraper(scraper);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert_eq!(respond(&h, "/metrics", "").await.status(), StatusCode::OK);
            assert!(body(respond(&h, "/metrics", "").await).await.0, "timed out");
        });
        // Without the fix the drop below blocks until this releases the scraper.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(10));
            let _ = release.send(());
        });
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}
