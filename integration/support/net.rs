// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Loopback ports for endpoints that are down.

use std::net::SocketAddr;

/// A loopback port held for an endpoint that is down: bound but not
/// listening, so connections to it are refused as by a stopped server,
/// while no other socket can take it. A port bound and released instead is
/// free for the next ephemeral port, another client's or the agent's own
/// retries connecting to themselves: one was taken so during a CI run's
/// outage, and the endpoint could not come back up on it.
pub struct HeldPort {
    pub address: SocketAddr,
    socket: Option<socket2::Socket>,
}

impl HeldPort {
    pub fn hold() -> HeldPort {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("TCP socket");
        let any_port: SocketAddr = "127.0.0.1:0".parse().expect("literal address");
        socket.bind(&any_port.into()).expect("bind a loopback port");
        let address = socket
            .local_addr()
            .expect("bound address")
            .as_socket()
            .expect("an IP address");
        HeldPort {
            address,
            socket: Some(socket),
        }
    }

    /// Starts listening on the held port; once only.
    pub fn listen(&mut self) -> std::net::TcpListener {
        let socket = self
            .socket
            .take()
            .unwrap_or_else(|| panic!("{} is already listening", self.address));
        socket.listen(128).expect("listen on the held port");
        socket.into()
    }
}
