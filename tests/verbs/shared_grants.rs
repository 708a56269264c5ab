//! Shared regions granted per connection (`SessionCx::grant`): the application updates
//! one registration in place and every peer sees it through a window of its own; a grant
//! gives its access only, dies when revoked, ends where the region ends, and a read-only
//! file mapping cannot be granted for writing.
//!
//! Found here: rxe does not bound an access through a window by the window's range, only
//! by the range of the MR underneath (a 17-byte READ through a 16-byte window in the
//! middle of a 64-byte region succeeds). So the out-of-range check uses a grant that
//! ends where the region ends, and the framework never binds windows over sub-ranges of
//! memory other peers' data lives in.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rdmactor::runtime::{
    Client, ClientConnection, GrantId, Incoming, NodeConfig, PeerInfo, Server, Service, Session,
    SessionCx, SessionError,
};
use rdmactor::verbs::{Access, RemoteRegion, SharedRegion};
use rdmactor_testkit::remote_region::{decode, encode};
use rdmactor_tests::{
    actix_run, assert_released, rdma_context, resource_counts, test_addr, wait_idle,
};

/// The granted range of the in-memory region (64 bytes): its last 16 bytes.
const GRANTED: std::ops::Range<usize> = 48..64;

/// The regions, registered once the server (and its PD) exists.
type Regions = Arc<OnceLock<(SharedRegion, SharedRegion)>>;

struct Grants(Regions);

impl Service for Grants {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(GrantSession {
            regions: self.0.clone(),
            grant: None,
        })
    }
}

struct GrantSession {
    regions: Regions,
    grant: Option<GrantId>,
}

impl Session for GrantSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        let (memory, file) = self
            .regions
            .get()
            .expect("regions registered before connects");
        let reply = match &msg.data[..] {
            b"grant" => {
                let grant = cx.grant(memory, GRANTED, Access::REMOTE_READ)?;
                assert_eq!(cx.granted(grant.id), Some(grant.remote));
                self.grant = Some(grant.id);
                encode(grant.remote)
            }
            b"revoke" => {
                let id = self.grant.take().expect("a grant to revoke");
                cx.revoke(id);
                assert_eq!(cx.granted(id), None);
                b"revoked".to_vec()
            }
            b"write the file" => match cx.grant(file, 0..4, Access::REMOTE_WRITE) {
                Ok(_) => b"granted".to_vec(),
                Err(e) => e.to_string().into_bytes(),
            },
            other => return Err(SessionError::new(format!("unknown request {other:?}"))),
        };
        cx.reply(&msg, reply)
    }
}

async fn grant(conn: &ClientConnection) -> RemoteRegion {
    decode(&conn.request(b"grant".to_vec()).await.expect("grant"))
}

fn remote_access_error(e: &rdmactor::runtime::RequestError) -> bool {
    e.to_string().contains("RemoteAccess")
}

#[test]
fn grants_give_their_access_until_revoked_and_end_with_the_region() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let regions: Regions = Arc::new(OnceLock::new());
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("grants", Grants(regions.clone()))
            .start()
            .expect("server");
        let pd = server.protection_domain().await.expect("device present");
        let pd = &pd;
        let memory = SharedRegion::alloc(pd, 64).expect("shared region");
        memory.write(GRANTED.start, b"first version...").unwrap();
        let dir = std::env::temp_dir().join(format!("rdmactor-grants-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), b"file bytes").unwrap();
        let file =
            SharedRegion::map_file(pd, &std::fs::File::open(dir.join("f")).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!file.is_writable());
        assert!(
            file.write(0, b"x").is_err(),
            "read-only for the application too"
        );
        assert_eq!(file.read(0, 10).unwrap(), b"file bytes");
        assert!(regions.set((memory.clone(), file)).is_ok(), "set once");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");

        // Reads see the application's updates in place, no message needed.
        let a = client.connect(addr, "grants").await.expect("connect");
        let g = grant(&a).await;
        assert_eq!(
            (g.addr, g.len),
            (memory.addr() + 48, 16),
            "exactly the range"
        );
        assert_eq!(a.read(g, 16).await.unwrap(), b"first version...");
        memory.write(GRANTED.start, b"second version..").unwrap();
        assert_eq!(a.read(g, 16).await.unwrap(), b"second version..");
        // Revoked: the same rkey is dead at once.
        assert_eq!(a.request(b"revoke".to_vec()).await.unwrap(), b"revoked");
        let err = a.read(g, 16).await.unwrap_err();
        assert!(remote_access_error(&err), "{err}");

        // A READ grant does not allow WRITE.
        let b = client.connect(addr, "grants").await.expect("connect");
        let g = grant(&b).await;
        let err = b.write(g, b"nope".to_vec(), None).await.unwrap_err();
        assert!(remote_access_error(&err), "{err}");
        assert_eq!(&memory.read(48, 4).unwrap(), b"seco", "nothing written");
        // Nor from a registered buffer written in place (`write_from`): same status.
        let e = client.connect(addr, "grants").await.expect("connect");
        let g = grant(&e).await;
        let mut src = e.register(4, Access::NONE).expect("register");
        src.as_mut_slice().copy_from_slice(b"nope");
        let err = e.write_from(src, 0..4, g, None).await.unwrap_err();
        assert!(remote_access_error(&err), "{err}");
        assert_eq!(&memory.read(48, 4).unwrap(), b"seco", "nothing written");

        // One byte past the granted range (and the region).
        let c = client.connect(addr, "grants").await.expect("connect");
        let g = grant(&c).await;
        let past = RemoteRegion { len: 17, ..g };
        let err = c.read(past, 17).await.unwrap_err();
        assert!(remote_access_error(&err), "{err}");

        // A read-only file mapping cannot be granted for writing.
        let d = client.connect(addr, "grants").await.expect("connect");
        let answer = d.request(b"write the file".to_vec()).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.contains("read-only"), "{answer}");

        for conn in [a, b, c, d, e] {
            conn.close().await;
        }
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
        drop(memory);
        drop(regions);
    });
    assert_released(&base);
}
