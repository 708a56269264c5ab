//! The services that are written for any transport (`echo`, `discard`, `pingpong`),
//! served and called over the loopback transport through the whole runtime: natively, no
//! RDMA device. Their real-verbs runs are in `tests/` (the VM suite).

use std::net::SocketAddr;

use rdmactor::runtime::{Client, NodeConfig, RequestError, Server};
use rdmactor::transport::loopback::{Fabric, Loopback};
use rdmactor_services::echo::{Discard, Echo, EchoRequest, EchoResponse};
use rdmactor_services::pingpong::{PingPong, PingPongService};
use rdmactor_testkit::pattern;

const AT: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)),
    7471,
);

/// A server of echo, discard and pingpong on `fabric`, and a client of it.
fn serve(fabric: &Fabric) -> (Server<Loopback>, Client<Loopback>) {
    let server = Server::over(Loopback)
        .domain(fabric.device("server"))
        .listen(AT, None)
        .service("echo", Echo)
        .service("discard", Discard)
        .service("pingpong", PingPongService)
        .start()
        .expect("server");
    let client = Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
    (server, client)
}

#[test]
fn echo_returns_every_size_up_to_the_largest_message_byte_for_byte() {
    actix::System::new().block_on(async {
        let (server, client) = serve(&Fabric::default());
        let conn = client.connect(AT, "echo").await.unwrap();
        // Inline-sized, one receive buffer, just over it, and rendezvous (READ) sizes, up
        // to the largest message (16 MiB with its 4-byte length prefix).
        for (i, len) in [0usize, 1, 64, 4000, 4097, 65_536, 1 << 20, (16 << 20) - 4]
            .into_iter()
            .enumerate()
        {
            let payload = pattern(len, i as u64);
            let resp: EchoResponse = conn
                .request_typed(&EchoRequest {
                    payload: payload.clone(),
                })
                .await
                .unwrap_or_else(|e| panic!("{len} bytes: {e}"));
            assert!(resp.payload == payload, "{len} bytes came back different");
        }
        // Several connections at once, their requests interleaved.
        let mut calls = Vec::new();
        for i in 0..8 {
            let conn = client.connect(AT, "echo").await.unwrap();
            let payload = pattern(10_000 + i, 99);
            calls.push(actix::spawn(async move {
                let r: EchoResponse = conn
                    .request_typed(&EchoRequest {
                        payload: payload.clone(),
                    })
                    .await
                    .unwrap();
                r.payload == payload
            }));
        }
        for call in calls {
            assert!(
                call.await.unwrap(),
                "an interleaved echo came back different"
            );
        }
        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn discard_counts_every_one_way_message_in_order() {
    actix::System::new().block_on(async {
        let (server, client) = serve(&Fabric::default());
        let conn = client.connect(AT, "discard").await.unwrap();
        // Batches under the connection's queue bound (`max_queued_sends`): `send_all`
        // returns once they are queued, so each batch waits for the count to catch up.
        for b in 0..10u64 {
            let batch: Vec<Vec<u8>> = (0..500).map(|i| pattern(64, b * 500 + i)).collect();
            conn.send_all(batch).await.unwrap();
            let count: u64 = conn.request_typed(&()).await.unwrap();
            assert_eq!(count, (b + 1) * 500);
        }
        for i in 0..1000 {
            conn.send(pattern(100, i)).await.unwrap();
        }
        let count: u64 = conn.request_typed(&()).await.unwrap();
        assert_eq!(
            count, 6000,
            "the count answers after every message sent before it"
        );
        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn pingpong_answers_in_order_and_a_skipped_ping_ends_the_connection() {
    actix::System::new().block_on(async {
        let (server, client) = serve(&Fabric::default());
        let conn = client.connect(AT, "pingpong").await.unwrap();
        for seq in 0..100u64 {
            let payload = pattern(seq as usize, seq);
            let pong: PingPong = conn
                .request_typed(&PingPong::Ping {
                    seq,
                    payload: payload.clone(),
                })
                .await
                .unwrap();
            assert_eq!(pong, PingPong::Pong { seq, payload });
        }
        let skipped = conn
            .request_typed::<_, PingPong>(&PingPong::Ping {
                seq: 7,
                payload: vec![],
            })
            .await;
        match skipped {
            Err(RequestError::Closed(reason)) => {
                assert!(
                    reason.to_string().contains("7"),
                    "the reason names the ping: {reason}"
                )
            }
            other => panic!("a repeated ping must end the connection: {other:?}"),
        }
        // The server goes on serving others.
        let other = client.connect(AT, "pingpong").await.unwrap();
        let pong: PingPong = other
            .request_typed(&PingPong::Ping {
                seq: 0,
                payload: vec![1],
            })
            .await
            .unwrap();
        assert_eq!(
            pong,
            PingPong::Pong {
                seq: 0,
                payload: vec![1]
            }
        );
        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn a_message_over_the_servers_largest_is_refused_before_it_moves_and_the_connection_goes_on() {
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let mut config = NodeConfig::default();
        config.connection.max_message = 1 << 20;
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .config(config)
            .listen(AT, None)
            .service("echo", Echo)
            .start()
            .unwrap();
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        let conn = client.connect(AT, "echo").await.unwrap();
        let too_big = EchoRequest {
            payload: vec![7; 2 << 20],
        };
        match conn.request_typed::<_, EchoResponse>(&too_big).await {
            Err(RequestError::Refused(why)) => {
                assert!(
                    why.to_string().contains("1048576"),
                    "the server's limit named: {why}"
                )
            }
            other => panic!("2 MiB to a server taking 1 MiB must be refused: {other:?}"),
        }
        let small = EchoRequest {
            payload: vec![1, 2, 3],
        };
        let back: EchoResponse = conn.request_typed(&small).await.unwrap();
        assert_eq!(back.payload, [1, 2, 3]);
        let stats = server.stats().await;
        assert_eq!(stats.connections, 1, "the refusal closed nothing");
        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn ingest_hands_every_record_over_in_order_through_the_granted_ring() {
    use std::sync::{Arc, Mutex};

    use rdmactor_services::ingest::{Ingest, IngestConfig, IngestService, Record};

    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let got: Arc<Mutex<Vec<Record>>> = Arc::default();
        let sink = {
            let got = got.clone();
            Arc::new(move |r: Record| got.lock().unwrap().push(r))
        };
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .listen(AT, None)
            .service("ingest", IngestService::new(IngestConfig::default(), sink))
            .start()
            .unwrap();
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        let mut writers = Vec::new();
        for _ in 0..2 {
            writers.push(Ingest::connect(&client, AT, "ingest").await.unwrap());
        }
        let max = writers[0].max_record();
        // More records than the ring has slots: the writer waits for credits.
        let n = 3 * writers[0].ring().slots as usize;
        for i in 0..n {
            for (w, writer) in writers.iter_mut().enumerate() {
                writer
                    .push(&pattern(i % max, (w * n + i) as u64))
                    .await
                    .unwrap();
            }
        }
        for writer in &mut writers {
            assert_eq!(writer.flush().await.unwrap(), n as u64);
            assert_eq!(writer.free_slots(), writer.ring().slots as usize);
        }
        let got = std::mem::take(&mut *got.lock().unwrap());
        assert_eq!(got.len(), 2 * n);
        // The server numbers connections in the order it accepted them: writer 0's first.
        let mut conns: Vec<u64> = got.iter().map(|r| r.connection).collect();
        conns.sort_unstable();
        conns.dedup();
        assert_eq!(conns.len(), 2, "two writers, two connections");
        for (w, conn) in conns.into_iter().enumerate() {
            let mine: Vec<&Record> = got.iter().filter(|r| r.connection == conn).collect();
            assert_eq!(mine.len(), n, "writer {w}'s records");
            for (i, r) in mine.into_iter().enumerate() {
                assert_eq!(r.seq, i as u64, "writer {w}: in order");
                assert!(
                    r.data == pattern(i % max, (w * n + i) as u64),
                    "record {i} of writer {w}"
                );
            }
        }
        client.shutdown().await;
        server.shutdown().await;
    });
}

/// Issue 45: a connection whose handles are all dropped, without `close`, is closed: the
/// server is told and both sides release it. 2,000 of them, opened and dropped in batches
/// of 50 (under the 64 one address may hold; one echo each batch), leave nothing open and
/// no lease held on either side.
#[test]
fn two_thousand_dropped_connections_are_closed_on_both_sides() {
    actix::System::new().block_on(async {
        let (server, client) = serve(&Fabric::default());
        let payload = pattern(64, 45);
        let request = postcard::to_allocvec(&EchoRequest {
            payload: payload.clone(),
        })
        .unwrap();
        let reply = postcard::to_allocvec(&EchoResponse { payload }).unwrap();
        let probe = (&request[..], &reply[..]);
        rdmactor_testkit::dropped_connections_close(&server, &client, AT, "echo", probe, 2000, 50)
            .await;
        client.shutdown().await;
        server.shutdown().await;
    });
}

/// `members` over loopback: typed refusals for what a hostile or confused client asks,
/// and `connect_via`'s way past seeds and members that are gone, with each failure
/// named (the cluster's own directory is tested against etcd in the cluster crate, and
/// the whole path against `server --cluster` in the VM suite).
#[test]
fn members_answers_typed_and_connect_via_goes_past_what_is_gone() {
    use rdmactor::runtime::CallError;
    use rdmactor_services::members::{
        connect_via, members, BootstrapError, Member, MembersError, MembersService,
        StaticDirectory, MAX_SERVICE_NAME,
    };
    use std::time::Duration;

    let gone: SocketAddr = "10.0.0.9:7471".parse().unwrap();
    let member = |node: &str, addr: SocketAddr| Member {
        node: node.into(),
        addr,
        connections: 0,
    };
    actix::System::new().block_on(async move {
        let fabric = Fabric::default();
        let directory = StaticDirectory::new();
        directory.set("echo", vec![member("gone", gone), member("here", AT)]);
        directory.set("discard", vec![]);
        directory.set("pingpong", vec![member("gone", gone)]);
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .listen(AT, None)
            .service("echo", Echo)
            .handler("members", MembersService::new(directory))
            .start()
            .expect("server");
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
        let dial = Duration::from_secs(5);

        let ask = client.connect(AT, "members").await.unwrap();
        let long = "x".repeat(MAX_SERVICE_NAME + 1);
        assert!(matches!(
            members(&ask, &long).await,
            Err(CallError::Handler(MembersError::NameTooLong(n))) if n == long.len()
        ));
        assert!(matches!(
            members(&ask, "nothing").await,
            Err(CallError::Handler(MembersError::UnknownService(s))) if s == "nothing"
        ));
        assert_eq!(members(&ask, "echo").await.unwrap().len(), 2);
        // Asked again and again, the connection goes on.
        assert_eq!(members(&ask, "discard").await.unwrap(), vec![]);
        ask.close().await;

        // A gone seed, then a gone member, then the live one: both failures named.
        let got = connect_via(&client, &[gone, AT], "echo", dial)
            .await
            .unwrap();
        assert_eq!(got.member.node, "here");
        let failed: Vec<_> = got
            .failed
            .iter()
            .map(|f| (f.addr, f.node.clone()))
            .collect();
        assert_eq!(failed, [(gone, None), (gone, Some("gone".to_owned()))]);
        let resp: EchoResponse = got
            .connection
            .request_typed(&EchoRequest {
                payload: b"via a seed".to_vec(),
            })
            .await
            .unwrap();
        assert_eq!(resp.payload, b"via a seed");
        got.connection.close().await;

        // No seeds; a list with nobody in it; only gone members.
        assert_eq!(
            connect_via(&client, &[], "echo", dial).await.err(),
            Some(BootstrapError::NoSeeds)
        );
        match connect_via(&client, &[AT], "discard", dial).await {
            Err(BootstrapError::NoList(a)) => assert_eq!(a.len(), 1, "{a:?}"),
            other => panic!("an empty list: {:?}", other.map(|b| b.member)),
        }
        match connect_via(&client, &[AT], "pingpong", dial).await {
            Err(e @ BootstrapError::NoneServed(_)) => {
                assert!(e.to_string().contains("node gone at 10.0.0.9:7471"), "{e}");
            }
            other => panic!("only gone members: {:?}", other.map(|b| b.member)),
        }
        client.shutdown().await;
        server.shutdown().await;
    });
}
