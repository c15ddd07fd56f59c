//! The plugin's task set: one cancellation token, every long-running service a named
//! task. The first task to end before shutdown — by error, by panic, or by simply
//! returning — stops the plugin with that task named as the cause: a server that
//! vanished silently would leave the kubelet talking to a half-dead plugin, while an
//! exit makes the kubelet (or the DaemonSet) restart it whole.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Why the plugin stopped, when it was not asked to.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{task} {how}")]
pub struct TaskFailed {
    pub task: &'static str,
    /// "failed: <error>", "panicked: <message>" or "ended before shutdown".
    pub how: String,
}

/// How long the services get to stop after cancellation before they are aborted. The
/// DaemonSet's grace period is 30 s; this leaves the process time to remove its sockets
/// and exit before the kubelet's SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(20);

pub struct Supervisor {
    token: CancellationToken,
    tasks: JoinSet<Result<(), String>>,
    names: HashMap<Id, &'static str>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Supervisor {
    pub fn new() -> Self {
        Supervisor {
            token: CancellationToken::new(),
            tasks: JoinSet::new(),
            names: HashMap::new(),
        }
    }

    /// The token every service stops on.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Starts a service that stops on its own when the token is cancelled.
    pub fn spawn<E: Display>(
        &mut self,
        name: &'static str,
        service: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        let handle = self
            .tasks
            .spawn(async move { service.await.map_err(|e| e.to_string()) });
        self.names.insert(handle.id(), name);
    }

    /// Starts a service that returns nothing (a loop that only logs its errors).
    pub fn spawn_loop(
        &mut self,
        name: &'static str,
        service: impl Future<Output = ()> + Send + 'static,
    ) {
        self.spawn(name, async move {
            service.await;
            Ok::<(), std::convert::Infallible>(())
        });
    }

    /// Runs until `shutdown` resolves or a service ends, then cancels the token and
    /// waits up to `grace` for every service, aborting those still running. Returns the
    /// first service that ended on its own, if one did.
    pub async fn run_until(
        mut self,
        shutdown: impl Future<Output = ()>,
        grace: Duration,
    ) -> Result<(), TaskFailed> {
        let cause = tokio::select! {
            () = shutdown => {
                info!("shutting down");
                None
            }
            Some(ended) = self.tasks.join_next_with_id() => {
                let failed = self.verdict(ended);
                error!(task = failed.task, cause = %failed.how, "a plugin service stopped; stopping the plugin");
                Some(failed)
            }
        };
        self.token.cancel();
        let drained = tokio::time::timeout(grace, async {
            while let Some(ended) = self.tasks.join_next_with_id().await {
                let done = self.verdict(ended);
                if done.how != ENDED {
                    warn!(task = done.task, cause = %done.how, "a plugin service failed while stopping");
                }
            }
        })
        .await;
        if drained.is_err() {
            let left: Vec<&str> = self.names.values().copied().collect();
            warn!(tasks = ?left, grace_s = grace.as_secs_f64(), "services still running after the grace period; aborting them");
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
        match cause {
            Some(failed) => Err(failed),
            None => Ok(()),
        }
    }

    fn verdict(&mut self, ended: Result<(Id, Result<(), String>), JoinError>) -> TaskFailed {
        let (id, how) = match ended {
            Ok((id, Ok(()))) => (id, ENDED.to_string()),
            Ok((id, Err(e))) => (id, format!("failed: {e}")),
            Err(e) => {
                let id = e.id();
                let how = if e.is_panic() {
                    format!("panicked: {}", panic_message(e.into_panic()))
                } else {
                    "was cancelled".to_string()
                };
                (id, how)
            }
        };
        TaskFailed {
            task: self.names.remove(&id).unwrap_or("unnamed task"),
            how,
        }
    }
}

const ENDED: &str = "ended before shutdown";

/// The text of a panic payload (`panic!` with a literal or a formatted message).
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => (*s).to_string(),
            Err(_) => "(no message)".to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const GRACE: Duration = Duration::from_secs(5);

    /// A service that runs until the token is cancelled, counting its clean stops.
    async fn well_behaved(
        token: CancellationToken,
        stopped: Arc<AtomicUsize>,
    ) -> Result<(), String> {
        token.cancelled().await;
        stopped.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    #[tokio::test]
    async fn shutdown_cancels_every_service_and_is_no_error() {
        let mut s = Supervisor::new();
        let stopped = Arc::new(AtomicUsize::new(0));
        for name in ["a", "b", "c"] {
            s.spawn(name, well_behaved(s.token(), stopped.clone()));
        }
        assert_eq!(s.run_until(async {}, GRACE).await, Ok(()));
        assert_eq!(stopped.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_failing_service_stops_the_others_and_is_named() {
        let mut s = Supervisor::new();
        let stopped = Arc::new(AtomicUsize::new(0));
        s.spawn("publisher", well_behaved(s.token(), stopped.clone()));
        s.spawn("dra gRPC", async { Err::<(), _>("socket gone") });
        let got = s.run_until(std::future::pending(), GRACE).await;
        assert_eq!(
            got,
            Err(TaskFailed {
                task: "dra gRPC",
                how: "failed: socket gone".into()
            })
        );
        assert_eq!(
            stopped.load(Ordering::SeqCst),
            1,
            "the publisher was stopped cleanly"
        );
    }

    #[tokio::test]
    async fn a_panicking_service_is_fatal_with_its_message() {
        let mut s = Supervisor::new();
        let stopped = Arc::new(AtomicUsize::new(0));
        s.spawn("watchdog", well_behaved(s.token(), stopped.clone()));
        s.spawn_loop("compute shares", async {
            panic!("tick on a poisoned lock")
        });
        let got = s
            .run_until(std::future::pending(), GRACE)
            .await
            .unwrap_err();
        assert_eq!(got.task, "compute shares");
        assert_eq!(got.how, "panicked: tick on a poisoned lock");
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_service_returning_early_is_a_failure_too() {
        let mut s = Supervisor::new();
        s.spawn_loop("stale claim clean-up", async {});
        let got = s
            .run_until(std::future::pending(), GRACE)
            .await
            .unwrap_err();
        assert_eq!(
            got.to_string(),
            "stale claim clean-up ended before shutdown"
        );
    }

    #[tokio::test]
    async fn a_service_ignoring_the_token_is_aborted_after_the_grace_period() {
        let mut s = Supervisor::new();
        s.spawn_loop("stuck", std::future::pending());
        let started = std::time::Instant::now();
        assert_eq!(
            s.run_until(async {}, Duration::from_millis(50)).await,
            Ok(())
        );
        // Generous: the abort must come, not hang; the figure is printed, not judged tight.
        let took = started.elapsed();
        println!("aborted after {took:?}");
        assert!(took < Duration::from_secs(30), "{took:?}");
    }
}
