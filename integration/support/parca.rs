//! An in-test Parca server: `ProfileStoreService/WriteRaw` built from
//! Parca's proto, keeping every request.

use std::sync::{Arc, Mutex};

use icecore_otlp::export::parca::proto::profile_store_service_server::{
    ProfileStoreService, ProfileStoreServiceServer,
};
use icecore_otlp::export::parca::proto::{WriteRawRequest, WriteRawResponse};

/// A WriteRaw server generated from Parca's proto; keeps every request.
#[derive(Default, Clone)]
pub struct ParcaStore {
    pub requests: Arc<Mutex<Vec<WriteRawRequest>>>,
    /// How long each call waits before it is answered (a slow endpoint).
    pub delay: std::time::Duration,
}

#[tonic::async_trait]
impl ProfileStoreService for ParcaStore {
    async fn write_raw(
        &self,
        request: tonic::Request<WriteRawRequest>,
    ) -> Result<tonic::Response<WriteRawResponse>, tonic::Status> {
        tokio::time::sleep(self.delay).await;
        self.requests.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(WriteRawResponse::default()))
    }
}

/// Serves on 127.0.0.1 from a runtime of its own; returns the port.
pub fn serve(store: ParcaStore, runtime: &tokio::runtime::Runtime) -> u16 {
    serve_on(store, runtime, "127.0.0.1:0".parse().unwrap())
}

/// Serves on `address` from a runtime of its own; returns the port.
pub fn serve_on(
    store: ParcaStore,
    runtime: &tokio::runtime::Runtime,
    address: std::net::SocketAddr,
) -> u16 {
    let listener = std::net::TcpListener::bind(address).expect("bind the Parca test store");
    serve_with(store, runtime, listener)
}

/// Serves on a listener the caller bound; returns the port.
pub fn serve_with(
    store: ParcaStore,
    runtime: &tokio::runtime::Runtime,
    listener: std::net::TcpListener,
) -> u16 {
    listener.set_nonblocking(true).expect("nonblocking");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ProfileStoreServiceServer::new(store))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        port
    })
}

/// Every sample of every series of `requests`: each raw profile gunzipped
/// and decoded by the tests' own pprof decoder.
pub fn samples(requests: &[WriteRawRequest]) -> Vec<super::summary::DecodedSample> {
    let mut profiles = Vec::new();
    for sample in requests
        .iter()
        .flat_map(|r| &r.series)
        .flat_map(|s| &s.samples)
    {
        assert_eq!(sample.raw_profile[..2], [0x1f, 0x8b], "gzipped pprof");
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(sample.raw_profile.as_slice()),
            &mut raw,
        )
        .unwrap();
        profiles.push(super::pprof::decode_bytes(
            &raw,
            std::path::Path::new("parca"),
        ));
    }
    super::pprof::all_samples(&profiles)
}
