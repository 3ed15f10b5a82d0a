//! The test origin (`loadtests/origin`), served in the test's runtime.

use std::net::SocketAddr;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::client::get;

/// The test origin on a free loopback port, in the test's runtime; stopped
/// on drop.
pub struct Origin {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<()>>,
}

impl Origin {
    /// Start serving. Call it from the test's runtime (a `#[tokio::test]`).
    pub fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap())
    }

    /// Start serving on `addr` (an origin that comes back on its old port).
    pub fn start_on(addr: SocketAddr) -> Self {
        let std_listener = std::net::TcpListener::bind(addr).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(inlay_origin::serve(listener, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            served: Some(served),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests the origin saw for `path` (without query).
    pub async fn count(&self, path: &str) -> u64 {
        let r = get(&format!("{}/__count?path={}", self.url(), path)).await;
        r.text()
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("bad count {:?}", r.text()))
    }

    /// Stop, and return once the origin no longer accepts connections and
    /// its open ones are closed (or given up after its shutdown grace).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            served.await.unwrap();
        }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
