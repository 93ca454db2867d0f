{{/*
Chart name, truncated to the 63 characters a label value allows.
*/}}
{{- define "backpressure-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's resources: <release>-<chart>, or <release> when the release name
already contains the chart name (so release "backpressure-operator" gives
"backpressure-operator", matching config/).
*/}}
{{- define "backpressure-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart label value.
*/}}
{{- define "backpressure-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object, without the component.
*/}}
{{- define "backpressure-operator.commonLabels" -}}
helm.sh/chart: {{ include "backpressure-operator.chart" . }}
{{ include "backpressure-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: backpressure-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels on the operator's objects.
*/}}
{{- define "backpressure-operator.labels" -}}
{{ include "backpressure-operator.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Selector labels of the operator pods (immutable in the Deployment: keep them stable).
*/}}
{{- define "backpressure-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "backpressure-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "backpressure-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "backpressure-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Name of the leader-election Lease.
*/}}
{{- define "backpressure-operator.leaseName" -}}
{{- default (printf "%s-leader" (include "backpressure-operator.fullname" .)) .Values.leaderElection.leaseName | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Operator image reference.
*/}}
{{- define "backpressure-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
ServiceAccount user name as the API server sees it (what workers must accept on a push).
*/}}
{{- define "backpressure-operator.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "backpressure-operator.serviceAccountName" .) }}
{{- end }}

{{/*
The metadata lines templates/crds.yaml puts into each generated CRD (replacing its
"metadata:" line): the resource policy and the common labels.
*/}}
{{- define "backpressure-operator.crdMetadata" -}}
{{ "\n" }}metadata:
{{- if .Values.crds.keep }}
  annotations:
    helm.sh/resource-policy: keep
{{- end }}
  labels:
    {{- include "backpressure-operator.commonLabels" . | nindent 4 }}
    app.kubernetes.io/component: crd
{{ "" }}
{{- end }}

{{/*
"true" when the cluster serves ValidatingAdmissionPolicy admissionregistration.k8s.io/v1
(Kubernetes 1.30 or newer, from .Capabilities.KubeVersion: the server's version at install and
upgrade, --kube-version with `helm template`), else empty. The admission templates render
nothing on older clusters and NOTES.txt says so.
*/}}
{{- define "backpressure-operator.admissionSupported" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}true{{ end }}
{{- end }}

{{/*
Labels of the `helm test` Pod: not the operator's selector labels (the Service, PDB and
NetworkPolicy select those), so app.kubernetes.io/name gets a "-test" suffix.
*/}}
{{- define "backpressure-operator.testLabels" -}}
app.kubernetes.io/name: {{ include "backpressure-operator.name" . | trunc 58 | trimSuffix "-" }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: backpressure-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: helm-test
{{- end }}

{{/*
The operator's rules on namespaced resources: in the ClusterRole, or with watchNamespaces in a
Role per listed namespace (the same rules, each saying why).
*/}}
{{- define "backpressure-operator.namespacedRules" -}}
# Watch WorkerBackpressure objects (the controller's primary resource, from its cache) and
# patch metadata.finalizers to add and remove the finalizer that restores a guarded
# HPA/ScaledObject on deletion.
- apiGroups: ["backpressure.dev"]
  resources: ["workerbackpressures"]
  verbs: ["list", "watch", "patch"]
# Owner references with blockOwnerDeletion=true on the owned ConfigMaps require update on the
# owner's finalizers subresource (OwnerReferencesPermissionEnforcement): an authorization
# check at admission, never a request of its own.
- apiGroups: ["backpressure.dev"]
  resources: ["workerbackpressures/finalizers"]
  verbs: ["update"]
# Report observedGeneration, regime, replicas, ramp, fleet snapshot and conditions
# (server-side apply of the status subresource).
- apiGroups: ["backpressure.dev"]
  resources: ["workerbackpressures/status"]
  verbs: ["patch"]
# Watch the scaled workloads (metadata only) so a change of their replicas triggers a
# reconcile.
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["list", "watch"]
# Read and set replicas through /scale only (merge patch); the operator never writes the
# workload's spec.
- apiGroups: ["apps"]
  resources: ["deployments/scale", "statefulsets/scale"]
  verbs: ["get", "patch"]
{{- range $.Values.rbac.extraScaleTargets }}
# Extra scalable kind from rbac.extraScaleTargets: read and set replicas through /scale.
- apiGroups: [{{ .apiGroup | quote }}]
  resources: [{{ range $i, $r := .resources }}{{ if $i }}, {{ end }}{{ printf "%s/scale" $r | quote }}{{ end }}]
  verbs: ["get", "patch"]
{{- end }}
# Find the target's pods (label selector from /scale, from a cache): readiness, pod IP, admin
# port and the config hash each pod reports, to push the worker config and count pods in sync.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# The worker config is rendered into a ConfigMap owned by each WorkerBackpressure (the
# durable source the pods mount): watched (only those labelled as the operator's), read by
# name before the first write (one of that name may exist and not be the object's: it is
# then left alone), created, and server-side applied when the config changes. Never updated
# with PUT, never deleted (the garbage collector deletes it with its owner).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Events on every regime change and scaling action (events.k8s.io/v1; a repeat patches the
# event's series).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Guard mode: read the guarded HPA and clamp its scale-out (behavior.scaleUp.selectPolicy or
# maxReplicas, merge patch with a resourceVersion precondition) while held, restore it on
# release and on deletion. The optional ValidatingAdmissionPolicy of admission.scope limits
# which HPAs this reaches (values.yaml).
# And in every mode, list and watch all HPAs (only their scaleTargetRef is kept): an Active
# object whose target an HPA also scales writes nothing to it (Ready False,
# AutoscalerConflict) instead of fighting over the replicas.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "patch"]
# Guard mode: the same for a KEDA ScaledObject (annotation autoscaling.keda.sh/paused-scale-out
# and maxReplicaCount; no effect when KEDA is not installed).
# Listed and watched like the HPAs, to find an Active object's conflicting ScaledObject.
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "watch", "patch"]
{{- if $.Values.rbac.secrets.clusterWide }}
# rbac.secrets.clusterWide: spec.metrics.prometheus.secretRef may name a Secret in any
# namespace's own objects. get only: no list or watch, so no Secret is read without a name.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- end }}
