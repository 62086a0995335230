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
}

#[tonic::async_trait]
impl ProfileStoreService for ParcaStore {
    async fn write_raw(
        &self,
        request: tonic::Request<WriteRawRequest>,
    ) -> Result<tonic::Response<WriteRawResponse>, tonic::Status> {
        self.requests.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(WriteRawResponse::default()))
    }
}

/// Serves on 127.0.0.1 from a runtime of its own; returns the port.
pub fn serve(store: ParcaStore, runtime: &tokio::runtime::Runtime) -> u16 {
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ProfileStoreServiceServer::new(store))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        port
    })
}
