//! A tenant of a shared cluster: a user who may do anything with WorkerBackpressures in one
//! namespace and nothing else (no Secrets, no Deployments, no HPAs, no other namespace). The
//! security tests (`tenancy`) act through [`Tenant::client`], so what the tenant achieves is
//! what the operator does on its behalf, never what an admin client could do.

use backpressure_api::WorkerBackpressure;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::scene::{Scene, wbp_object};

/// A user with rights on WorkerBackpressures in one namespace only.
pub struct Tenant {
    /// The user name (`tenant:<namespace>`).
    pub user: String,
    /// The namespace the tenant owns.
    pub ns: String,
    /// A client impersonating the tenant.
    pub client: kube::Client,
}

impl Tenant {
    /// Grants `tenant:<scene.ns>` every verb on WorkerBackpressures in `scene.ns` (a Role and a
    /// RoleBinding created by the admin) and returns a client that impersonates it.
    pub async fn of(scene: &Scene) -> Tenant {
        let user = format!("tenant:{}", scene.ns);
        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": "wbp-editor"},
            "rules": [{
                "apiGroups": ["backpressure.dev"],
                "resources": ["workerbackpressures"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            }],
        }))
        .unwrap();
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "wbp-editor"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "wbp-editor"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }))
        .unwrap();
        Api::<Role>::namespaced(scene.client.clone(), &scene.ns)
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
        Api::<RoleBinding>::namespaced(scene.client.clone(), &scene.ns)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        let client = scene
            .env
            .client_as(&user, &["system:authenticated"])
            .unwrap();
        Tenant {
            user,
            ns: scene.ns.clone(),
            client,
        }
    }

    /// The WorkerBackpressure API of the tenant's namespace, as the tenant.
    pub fn wbps(&self) -> Api<WorkerBackpressure> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Server-side applies WorkerBackpressure `name` with `spec`, as the tenant (field manager
    /// `tenant`, forced). The error is the API server's (admission, RBAC).
    pub async fn apply(&self, name: &str, spec: Value) -> kube::Result<WorkerBackpressure> {
        let obj = wbp_object(name, spec);
        self.wbps()
            .patch(
                name,
                &PatchParams::apply("tenant").force(),
                &Patch::Apply(&obj),
            )
            .await
    }
}
