//! Docker container names from the Docker Engine API on its Unix socket:
//! each container ID icecore meets is asked for once
//! (`GET /containers/ID/json`) by a task of its own, and the answers kept
//! in an index the profiler reads without waiting. A container Docker does
//! not know (one of containerd or CRI-O) is remembered as unknown.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::mpsc;
use tracing::{debug, info};

use super::http_get::{GetError, body_bytes, get};

/// Where the Docker Engine listens by default.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// Containers remembered at most (answers and unknowns).
pub const MAX_CONTAINERS: usize = 8192;
/// Questions waiting at most; more are asked when the container is met again.
const QUEUE: usize = 1024;
/// Longest answer read: one container's description.
const MAX_BODY_BYTES: usize = 4 << 20;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What icecore keeps of a Docker container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DockerContainer {
    /// Its name, without Docker's leading `/`.
    pub name: String,
    /// Its image.
    pub image: String,
    /// Its labels (`com.docker.compose.service`...).
    pub labels: BTreeMap<String, String>,
}

/// Containers asked about: `Some` answered, `None` unknown to Docker or
/// asked and waiting.
#[derive(Debug, Default)]
pub struct DockerIndex {
    containers: HashMap<String, Option<Arc<DockerContainer>>>,
    generation: u64,
}

impl DockerIndex {
    /// The container `id`, once Docker answered.
    pub fn get(&self, id: &str) -> Option<Arc<DockerContainer>> {
        self.containers.get(id).cloned().flatten()
    }

    /// Changes each time an answer arrives.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn asked(&self, id: &str) -> bool {
        self.containers.contains_key(id)
    }

    fn mark_asked(&mut self, id: &str) -> bool {
        if self.containers.len() >= MAX_CONTAINERS {
            return false;
        }
        self.containers.insert(id.to_owned(), None);
        true
    }

    fn answer(&mut self, id: String, container: Option<DockerContainer>) {
        if let Some(container) = container {
            self.containers.insert(id, Some(Arc::new(container)));
            self.generation += 1;
        }
    }
}

/// The index and the way to ask about a container.
#[derive(Debug, Clone)]
pub struct DockerNames {
    index: Arc<RwLock<DockerIndex>>,
    questions: mpsc::Sender<String>,
}

impl DockerNames {
    /// Starts the task asking the Docker Engine at `socket`.
    pub fn spawn(socket: PathBuf) -> Self {
        let index = Arc::new(RwLock::new(DockerIndex::default()));
        let (questions, mut pending) = mpsc::channel::<String>(QUEUE);
        let answers = index.clone();
        tokio::spawn(async move {
            info!(socket = %socket.display(), "naming Docker containers");
            while let Some(id) = pending.recv().await {
                let answer = tokio::time::timeout(REQUEST_TIMEOUT, inspect(&socket, &id))
                    .await
                    .unwrap_or(Err(GetError::Timeout));
                let container = match answer {
                    Ok(container) => Some(container),
                    Err(GetError::Status { status: 404, .. }) => None,
                    Err(e) => {
                        debug!(id, "no Docker name: {e}");
                        None
                    }
                };
                if let Ok(mut index) = answers.write() {
                    index.answer(id, container);
                }
            }
        });
        DockerNames { index, questions }
    }

    /// The container's name and labels if Docker answered already; asks
    /// (once) otherwise.
    pub fn lookup(&self, id: &str) -> Option<Arc<DockerContainer>> {
        if id.is_empty() {
            return None;
        }
        if let Ok(index) = self.index.read()
            && index.asked(id)
        {
            return index.get(id);
        }
        if let Ok(mut index) = self.index.write()
            && index.mark_asked(id)
            && self.questions.try_send(id.to_owned()).is_err()
        {
            // Full: asked again when the container is met again.
            index.containers.remove(id);
        }
        None
    }

    /// Changes each time an answer arrives.
    pub fn generation(&self) -> u64 {
        self.index.read().map_or(0, |i| i.generation())
    }
}

/// `GET /containers/ID/json`, the part icecore reads.
#[derive(Debug, Deserialize)]
struct Inspect {
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "Config", default)]
    config: InspectConfig,
}

#[derive(Debug, Default, Deserialize)]
struct InspectConfig {
    #[serde(rename = "Image", default)]
    image: String,
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

fn parse(body: &[u8]) -> Result<DockerContainer, serde_json::Error> {
    let inspect: Inspect = serde_json::from_slice(body)?;
    Ok(DockerContainer {
        name: inspect.name.trim_start_matches('/').to_owned(),
        image: inspect.config.image,
        labels: inspect.config.labels.unwrap_or_default(),
    })
}

async fn inspect(socket: &std::path::Path, id: &str) -> Result<DockerContainer, GetError> {
    if !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(GetError::Http("not a container ID".into()));
    }
    let stream = tokio::net::UnixStream::connect(socket).await?;
    let body = get(stream, "docker", &format!("/containers/{id}/json"), None).await?;
    Ok(parse(&body_bytes(body, MAX_BODY_BYTES).await?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inspect_answer_gives_name_image_and_labels() {
        let body = br#"{"Id":"abc","Name":"/web-1","Config":{"Image":"nginx:1.27",
            "Labels":{"com.docker.compose.service":"web"}},"State":{"Pid":42}}"#;
        let container = parse(body).unwrap();
        assert_eq!(container.name, "web-1");
        assert_eq!(container.image, "nginx:1.27");
        assert_eq!(container.labels["com.docker.compose.service"], "web");
        let bare = parse(br#"{"Name":"/x","Config":{"Labels":null}}"#).unwrap();
        assert!(bare.labels.is_empty());
        assert!(parse(b"[1,2]").is_err());
    }

    #[test]
    fn the_index_answers_once_and_stays_bounded() {
        let mut index = DockerIndex::default();
        assert!(index.mark_asked("a"));
        assert!(index.asked("a") && index.get("a").is_none());
        index.answer("a".into(), None);
        assert_eq!(
            index.generation(),
            0,
            "an unknown container changes nothing"
        );
        index.answer(
            "a".into(),
            Some(DockerContainer {
                name: "web".into(),
                ..DockerContainer::default()
            }),
        );
        assert_eq!(
            index.get("a").map(|c| c.name.clone()).as_deref(),
            Some("web")
        );
        assert_eq!(index.generation(), 1);
        for i in 0..MAX_CONTAINERS + 5 {
            index.mark_asked(&i.to_string());
        }
        assert!(index.containers.len() <= MAX_CONTAINERS);
    }
}
