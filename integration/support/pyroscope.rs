//! A Grafana Pyroscope push endpoint for the tests: an HTTP/1.1 server
//! that answers `POST /push.v1.PusherService/Push` as a Connect server
//! does, and decodes each request from the protobuf wire format by
//! Pyroscope's published field numbers (`push.v1.PushRequest`: 1 series;
//! `RawProfileSeries`: 1 labels, 2 samples; `types.v1.LabelPair`: 1 name,
//! 2 value; `RawSample`: 1 raw_profile, 2 ID). It shares no code with
//! icecore's exporter, so a wrong field number or path fails the test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::pprof::{PprofProfile, decode_bytes};

/// One series of one push.
#[derive(Debug, Clone)]
pub struct PushedSeries {
    /// Its labels, in the order sent.
    pub labels: Vec<(String, String)>,
    /// Its profiles, un-gzipped and decoded.
    pub profiles: Vec<PprofProfile>,
}

impl PushedSeries {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Push {
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The series it carried.
    pub series: Vec<PushedSeries>,
}

impl Push {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The running server; stops when dropped.
pub struct PyroscopeServer {
    address: SocketAddr,
    pushes: Arc<Mutex<Vec<Push>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PyroscopeServer {
    /// Serves on `address` (`127.0.0.1:0` for any port).
    pub fn start_on(address: SocketAddr) -> PyroscopeServer {
        PyroscopeServer::start_slow_on(address, Duration::ZERO)
    }

    /// Like [`PyroscopeServer::start_on`], answering each push `delay` after
    /// it was read.
    pub fn start_slow_on(address: SocketAddr, delay: Duration) -> PyroscopeServer {
        let listener = TcpListener::bind(address).expect("bind the Pyroscope test server");
        PyroscopeServer::start_slow_with(listener, delay)
    }

    /// Like [`PyroscopeServer::start_slow_on`], serving a listener the
    /// caller bound.
    pub fn start_slow_with(listener: TcpListener, delay: Duration) -> PyroscopeServer {
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        let pushes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (pushes, stop) = (pushes.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            if let Some(push) = serve(stream, delay) {
                                pushes.lock().unwrap().push(push);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
        };
        PyroscopeServer {
            address,
            pushes,
            stop,
            thread: Some(thread),
        }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Every push received so far.
    pub fn pushes(&self) -> Vec<Push> {
        self.pushes.lock().unwrap().clone()
    }
}

impl Drop for PyroscopeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one request, answers it, and returns it when it was a push.
fn serve(stream: TcpStream, delay: Duration) -> Option<Push> {
    stream.set_nonblocking(false).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let mut stream = stream;
    if method != "POST" || path != "/push.v1.PusherService/Push" {
        let _ = stream.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 47\r\n\r\n{\"code\":\"unimplemented\",\"message\":\"not found\"}",
        );
        return None;
    }
    let series = decode_push(&body);
    std::thread::sleep(delay);
    let _ = stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/proto\r\nContent-Length: 0\r\n\r\n",
    );
    Some(Push { headers, series })
}

/// A `PushRequest`'s series.
fn decode_push(body: &[u8]) -> Vec<PushedSeries> {
    fields(body)
        .into_iter()
        .filter(|(number, _)| *number == 1)
        .map(|(_, series)| {
            let mut labels = Vec::new();
            let mut profiles = Vec::new();
            for (number, value) in fields(&series) {
                match number {
                    1 => {
                        let pair = fields(&value);
                        let text = |n: u64| {
                            pair.iter()
                                .find(|(k, _)| *k == n)
                                .map(|(_, v)| String::from_utf8(v.clone()).expect("UTF-8 label"))
                                .unwrap_or_default()
                        };
                        labels.push((text(1), text(2)));
                    }
                    2 => {
                        for (n, raw) in fields(&value) {
                            if n == 1 {
                                let mut pprof = Vec::new();
                                flate2::read::GzDecoder::new(&raw[..])
                                    .read_to_end(&mut pprof)
                                    .expect("a gzipped profile");
                                profiles.push(decode_bytes(
                                    &pprof,
                                    std::path::Path::new("pyroscope push"),
                                ));
                            }
                        }
                    }
                    other => panic!("unknown RawProfileSeries field {other}"),
                }
            }
            PushedSeries { labels, profiles }
        })
        .collect()
}

/// The length-delimited fields of a message, as (field number, bytes);
/// panics on any other wire type, which no field here has.
fn fields(mut buf: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf);
        assert_eq!(key & 7, 2, "field {} is not length-delimited", key >> 3);
        let length = varint(&mut buf) as usize;
        out.push((key >> 3, buf[..length].to_vec()));
        buf = &buf[length..];
    }
    out
}

fn varint(buf: &mut &[u8]) -> u64 {
    let mut value = 0;
    for shift in (0..64).step_by(7) {
        let byte = buf[0];
        *buf = &buf[1..];
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            break;
        }
    }
    value
}
