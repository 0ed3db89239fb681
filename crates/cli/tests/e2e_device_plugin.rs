//! `cumux device-plugin` against a kubelet stand-in that speaks the kubelet's
//! real gRPC device-plugin API over unix sockets: the plugin registers, lists
//! the server's memory as units, and for an allocation lists a tenant on the
//! cumux server whose token, socket and driver the container gets; a program
//! run with that token sees the units' memory as its device.

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{tenant_program, wait_bounded, ServerProc, TempDir, CUMUX};
use cumux_cli::device_plugin::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use cumux_cli::device_plugin::podresources::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use cumux_cli::device_plugin::unix_channel;
use cumux_cli::device_plugin::v1beta1::device_plugin_client::DevicePluginClient;
use cumux_cli::device_plugin::v1beta1::registration_server::{Registration, RegistrationServer};
use cumux_cli::device_plugin::v1beta1::*;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// The kubelet's registration service: hands each request to the test.
struct Kubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(
        &self,
        request: tonic::Request<RegisterRequest>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(Empty {}))
    }
}

/// The kubelet's pod-resources service: the pods the test says there are.
#[derive(Clone, Default)]
struct Pods(Arc<Mutex<Vec<String>>>);

#[tonic::async_trait]
impl PodResourcesLister for Pods {
    async fn list(
        &self,
        _: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        let ids = self.0.lock().unwrap().clone();
        let pod = PodResources {
            name: "trainer".into(),
            namespace: "default".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: "cumux.io/gpu-memory".into(),
                    device_ids: ids,
                }],
            }],
        };
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: vec![pod],
        }))
    }
}

/// Kills the plugin at the end of the test, however it ends.
struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_pod_gets_a_tenant_with_its_share() {
    let server = ServerProc::start_with_config("plugin", Some("allow_unknown = false\n"));
    let kubelet_dir = TempDir::new("plugin-kubelet");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (tx, mut registered) = mpsc::unbounded_channel();
    let kubelet_socket = kubelet_dir.0.join("kubelet.sock");
    let listener = runtime
        .block_on(async { tokio::net::UnixListener::bind(&kubelet_socket) })
        .unwrap();
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet(tx)))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let pods = Pods::default();
    let pods_socket = kubelet_dir.0.join("pod-resources.sock");
    let listener = runtime
        .block_on(async { tokio::net::UnixListener::bind(&pods_socket) })
        .unwrap();
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(pods.clone()))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    // The pod that will be given units 2 and 3.
    *pods.0.lock().unwrap() = vec!["gpu0-2".into(), "gpu0-3".into()];

    let plugin = Plugin(
        Command::new(CUMUX)
            .args([
                "device-plugin",
                "--server",
                &server.address,
                "--unit",
                "512M",
            ])
            .arg("--kubelet-dir")
            .arg(&kubelet_dir.0)
            .args([
                "--driver-dir",
                "/opt/cumux-driver",
                "--gc-interval",
                "300ms",
            ])
            .arg("--pod-resources")
            .arg(&pods_socket)
            .stdout(Stdio::null())
            .spawn()
            .expect("cumux device-plugin starts"),
    );

    runtime.block_on(async {
        let request = tokio::time::timeout(Duration::from_secs(60), registered.recv())
            .await
            .expect("the plugin registers")
            .unwrap();
        assert_eq!(request.version, "v1beta1");
        assert_eq!(request.endpoint, "cumux.sock");
        assert_eq!(request.resource_name, "cumux.io/gpu-memory");

        let plugin_socket = kubelet_dir.0.join("cumux.sock");
        let channel = unix_channel(plugin_socket)
            .await
            .expect("the plugin answers");
        let mut client = DevicePluginClient::new(channel);
        // 2 GiB of the CPU device in 512 MiB units, all healthy.
        let mut devices = client.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = devices.message().await.unwrap().expect("a device list");
        let ids: Vec<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["gpu0-0", "gpu0-1", "gpu0-2", "gpu0-3"]);
        assert!(first.devices.iter().all(|d| d.health == "Healthy"));

        // A unit it does not offer is refused.
        let bad = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["gpu7-0".into()],
            }],
        };
        let refused = client.allocate(bad).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");

        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["gpu0-2".into(), "gpu0-3".into()],
            }],
        };
        let answer = client.allocate(request).await.unwrap().into_inner();
        let container = &answer.container_responses[0];
        let envs: HashMap<&str, &str> = container
            .envs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert!(envs["CUMUX_TENANT"].starts_with("pod-"), "{envs:?}");
        assert_eq!(envs["CUMUX_TOKEN"].len(), 64, "{envs:?}");
        assert_eq!(envs["CUMUX_SERVER"], "unix:/run/cumux/s.sock");
        assert_eq!(envs["LD_LIBRARY_PATH"], "/usr/local/cumux/lib");
        let mounts: Vec<(&str, &str)> = container
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect();
        let socket_dir = server.dir.0.display().to_string();
        assert!(mounts.contains(&(&socket_dir, "/run/cumux")), "{mounts:?}");
        assert!(
            mounts.contains(&("/opt/cumux-driver", "/usr/local/cumux/lib")),
            "{mounts:?}"
        );

        // The container's program, with its token: the units' memory is its device.
        let token = envs["CUMUX_TOKEN"].to_string();
        let probe = tenant_program("quota_probe");
        let child = server
            .command(&probe, &[])
            .env("CUMUX_TOKEN", &token)
            .spawn()
            .unwrap();
        let out = wait_bounded(child, Duration::from_secs(300));
        assert_eq!(out.code(), Some(0), "{}", out.describe());
        let total = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("total "))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok());
        assert_eq!(total, Some(1 << 30), "{}", out.stdout);

        // The pod ends: its tenant goes, and its token with it.
        pods.0.lock().unwrap().clear();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let child = server
                .command(&probe, &[])
                .env("CUMUX_TOKEN", &token)
                .spawn()
                .unwrap();
            let out = wait_bounded(child, Duration::from_secs(300));
            if out.code() != Some(0) {
                assert!(out.stderr.contains("token"), "{}", out.describe());
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the tenant outlived its pod"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    drop(plugin);
}
