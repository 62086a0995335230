//! What icecore knows of a process beyond its executable: its container and
//! Kubernetes pod, for the OTLP resource and the labels.

pub mod build_id;
pub mod cgroup;
pub mod docker;
mod http_get;
pub mod kubernetes;
pub mod labels;
pub mod pods;
