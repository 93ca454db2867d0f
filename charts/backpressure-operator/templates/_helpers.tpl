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
