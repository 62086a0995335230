//! One gRPC endpoint as the exporters reach it: URL and TLS checked up
//! front, a lazily connected channel, metadata on every call, and unary
//! calls whose request is already-encoded bytes.

use std::marker::PhantomData;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::{BufMut, Bytes};
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint};

use super::tls::TlsOptions;
use super::token_file::{TOKEN_REFRESH, TokenFile};
use super::{Compression, ExportError};

/// Largest request sent, the usual collector receive limit (32 MiB).
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;

/// A checked gRPC endpoint.
#[derive(Debug)]
pub(crate) struct GrpcTarget {
    url: String,
    config: Endpoint,
    metadata: MetadataMap,
    token: Option<TokenFile>,
    compression: Compression,
    // Created on first use: tonic's channel spawns a task, which needs a runtime.
    channel: OnceLock<Channel>,
}

impl GrpcTarget {
    /// Checks the URL (`http://` or `https://`), TLS options and headers,
    /// and reads the bearer token file, if any.
    pub(crate) fn new(
        url: &str,
        timeout: Duration,
        headers: &[(String, String)],
        bearer_token_file: Option<&std::path::Path>,
        compression: Compression,
        tls: &TlsOptions,
    ) -> Result<Self, ExportError> {
        let scheme = url
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        let secure = match scheme.as_deref() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(ExportError::UnsupportedScheme {
                    endpoint: url.to_owned(),
                });
            }
        };
        let mut config = Endpoint::from_shared(url.to_owned())
            .map_err(|source| ExportError::InvalidEndpoint {
                endpoint: url.to_owned(),
                source,
            })?
            .timeout(timeout)
            .connect_timeout(timeout);
        if secure {
            config = super::tls::configure(url, config, tls)?;
        } else if tls.is_customised() {
            return Err(ExportError::TlsOptionsWithoutTls {
                endpoint: url.to_owned(),
            });
        }
        Ok(Self {
            url: url.to_owned(),
            config,
            metadata: metadata(headers)?,
            token: bearer_token_file
                .map(|path| TokenFile::open(path, TOKEN_REFRESH))
                .transpose()?,
            compression,
            channel: OnceLock::new(),
        })
    }

    /// The URL as given.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Calls `path` with `body` (an encoded request message) and decodes the
    /// response as `R`. Must be called within a tokio runtime.
    pub(crate) async fn unary<R>(&self, path: &'static str, body: Bytes) -> Result<R, ExportError>
    where
        R: Message + Default + Send + 'static,
    {
        if body.len() > MAX_MESSAGE_BYTES {
            return Err(ExportError::MessageTooLarge {
                size: body.len(),
                limit: MAX_MESSAGE_BYTES,
            });
        }
        let channel = self
            .channel
            .get_or_init(|| self.config.connect_lazy())
            .clone();
        let mut grpc =
            tonic::client::Grpc::new(channel).max_encoding_message_size(MAX_MESSAGE_BYTES);
        if self.compression == Compression::Gzip {
            grpc = grpc
                .send_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Gzip);
        }
        let rpc_error = |status: tonic::Status| ExportError::Rpc {
            endpoint: self.url.clone(),
            status: Box::new(status),
        };
        grpc.ready().await.map_err(|e| {
            // Not ready means not connected: worth retrying, like a refused connection.
            rpc_error(tonic::Status::unavailable(format!(
                "connection not ready: {e}"
            )))
        })?;
        let mut request = tonic::Request::new(body);
        *request.metadata_mut() = self.metadata.clone();
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.value());
        }
        let codec = RawCodec::<R>(PhantomData);
        grpc.unary(request, PathAndQuery::from_static(path), codec)
            .await
            .map(tonic::Response::into_inner)
            .map_err(rpc_error)
    }
}

/// The headers as gRPC metadata; names are lower-cased, as HTTP/2 requires.
fn metadata(headers: &[(String, String)]) -> Result<MetadataMap, ExportError> {
    let mut map = MetadataMap::new();
    for (name, value) in headers {
        let key: AsciiMetadataKey =
            name.to_ascii_lowercase()
                .parse()
                .map_err(|_| ExportError::InvalidHeader {
                    name: name.clone(),
                    reason: "not a valid gRPC metadata name",
                })?;
        if key.as_str().ends_with("-bin") {
            return Err(ExportError::InvalidHeader {
                name: name.clone(),
                reason: "binary (-bin) metadata is not supported",
            });
        }
        let value: AsciiMetadataValue = value.parse().map_err(|_| ExportError::InvalidHeader {
            name: name.clone(),
            reason: "the value is not printable ASCII",
        })?;
        map.append(key, value);
    }
    Ok(map)
}

/// Sends already-encoded request bytes as they are and decodes the response,
/// so requests wait in the queue as compact bytes, not as message trees.
struct RawCodec<R>(PhantomData<fn() -> R>);

impl<R: Message + Default + Send + 'static> Codec for RawCodec<R> {
    type Encode = Bytes;
    type Decode = R;
    type Encoder = RawEncoder;
    type Decoder = MessageDecoder<R>;

    fn encoder(&mut self) -> Self::Encoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        MessageDecoder(PhantomData)
    }
}

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

struct MessageDecoder<R>(PhantomData<fn() -> R>);

impl<R: Message + Default> Decoder for MessageDecoder<R> {
    type Item = R;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        R::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("undecodable response: {e}")))
    }
}
