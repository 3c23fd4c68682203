{{/* Names, labels and shared snippets of the gazette chart. */}}

{{- define "gazette.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-gazette, or the release name when it already says gazette; 40 characters
leave room for the component suffixes (-operator, -etcd-peers...). */}}
{{- define "gazette.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object: pass (dict "ctx" $ "component" "broker"). */}}
{{- define "gazette.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gazette
{{ include "gazette.selectorLabels" . }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gazette.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gazette.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference: pass (dict "ctx" $ "image" .Values.broker.image). image.registry
prefixes repositories that name no registry host of their own (the gazette images, not
quay.io/...). Tags default to image.tag, then the chart's appVersion; "@sha256:..." alone is a digest, "tag@sha256:..."
both (skaffold's form), and a trailing "@" (skaffold without a digest) is dropped. */}}
{{- define "gazette.image" -}}
{{- $registry := .ctx.Values.image.registry -}}
{{- $tag := .image.tag | default .ctx.Values.image.tag | default .ctx.Chart.AppVersion | trimSuffix "@" -}}
{{- $repo := .image.repository -}}
{{- /* A repository naming its own registry host (quay.io/coreos/etcd) is left alone. */ -}}
{{- $parts := splitList "/" $repo -}}
{{- $host := first $parts -}}
{{- $ownRegistry := and (gt (len $parts) 1) (or (contains "." $host) (contains ":" $host) (eq $host "localhost")) -}}
{{- if and $registry (not $ownRegistry) }}{{ $repo = printf "%s/%s" $registry $repo }}{{ end -}}
{{- if hasPrefix "@" $tag -}}
{{ printf "%s%s" $repo $tag }}
{{- else -}}
{{ printf "%s:%s" $repo $tag }}
{{- end -}}
{{- end -}}

{{- define "gazette.etcd.fullname" -}}
{{- printf "%s-etcd" (include "gazette.fullname" .) -}}
{{- end -}}

{{/* The etcd client endpoint every component connects to (https:// under etcd.tls). */}}
{{- define "gazette.etcd.endpoint" -}}
{{- printf "%s://%s.%s.svc:%d" (ternary "https" "http" .Values.etcd.tls.enabled) (include "gazette.etcd.fullname" .) .Release.Namespace (int .Values.etcd.clientPort) -}}
{{- end -}}

{{/* The brokers' headless Service (rendered under tls.enabled): each broker's DNS name. */}}
{{- define "gazette.broker.peers" -}}
{{- printf "%s-broker-peers" (include "gazette.fullname" .) -}}
{{- end -}}

{{/* The consumer application's objects' name, and its component label. */}}
{{- define "gazette.consumer.fullname" -}}
{{- printf "%s-consumer-%s" (include "gazette.fullname" .) (include "gazette.resourceName" .Values.consumer.app) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gazette.consumer.component" -}}
{{- printf "consumer-%s" (include "gazette.resourceName" .Values.consumer.app) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The brokers' gRPC address (host:port of their Service): any broker serves any journal. */}}
{{- define "gazette.broker.address" -}}
{{- printf "%s-broker.%s.svc:%d" (include "gazette.fullname" .) .Release.Namespace (int .Values.broker.grpcPort) -}}
{{- end -}}

{{- define "gazette.minio.fullname" -}}
{{- printf "%s-minio" (include "gazette.fullname" .) -}}
{{- end -}}

{{- define "gazette.minio.endpoint" -}}
{{- printf "http://%s.%s.svc:%d" (include "gazette.minio.fullname" .) .Release.Namespace (int .Values.minio.port) -}}
{{- end -}}

{{/* The store URL of the MinIO bucket, for journals declared in values. The endpoint is
not in the URL: brokers and Spark jobs are given it (gazette.s3.endpoint), so the same URL
works in every release and in operator/examples. */}}
{{- define "gazette.minio.store" -}}
{{- printf "s3://%s/" .Values.minio.bucket -}}
{{- end -}}

{{/* The S3 endpoint of s3:// stores without ?endpoint=: broker.s3.endpoint, else MinIO's
when minio.enabled, else none (AWS S3). */}}
{{- define "gazette.s3.endpoint" -}}
{{- if .Values.broker.s3.endpoint -}}
{{- .Values.broker.s3.endpoint -}}
{{- else if .Values.minio.enabled -}}
{{- include "gazette.minio.endpoint" . -}}
{{- end -}}
{{- end -}}

{{- define "gazette.serviceAccountName" -}}
{{- $sa := index .ctx.Values .component "serviceAccount" -}}
{{- if $sa.create -}}
{{- default (printf "%s-%s" (include "gazette.fullname" .ctx) .component) $sa.name -}}
{{- else -}}
{{- default "default" $sa.name -}}
{{- end -}}
{{- end -}}

{{/* The secret holding the brokers' S3 credentials, or nothing. */}}
{{- define "gazette.s3.secret" -}}
{{- if .Values.broker.s3.existingSecret -}}
{{- .Values.broker.s3.existingSecret -}}
{{- else if .Values.minio.enabled -}}
{{- include "gazette.minio.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* The S3 settings of the stores as a container's env entries: the region, the endpoint
(gazette.s3.endpoint) and, when there is a secret (gazette.s3.secret), the credentials
from it. Brokers and Spark jobs
(their drivers and executors) read the same stores with the same credentials; without a
secret, each pod uses its ambient credentials (IRSA, instance profile). */}}
{{- define "gazette.s3.env" -}}
{{- $s3secret := include "gazette.s3.secret" . -}}
- {name: AWS_DEFAULT_REGION, value: {{ .Values.broker.s3.region | quote }}}
{{- with include "gazette.s3.endpoint" . }}
- {name: AWS_ENDPOINT_URL_S3, value: {{ . | quote }}}
{{- end }}
{{- if $s3secret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom: {secretKeyRef: {name: {{ $s3secret }}, key: AWS_ACCESS_KEY_ID}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ $s3secret }}, key: AWS_SECRET_ACCESS_KEY}}
{{- end }}
{{- end -}}

{{/* A restricted container security context: non-root, no privilege, read-only root. */}}
{{- define "gazette.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* A pod's scheduling knobs from a component's values. */}}
{{- define "gazette.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A custom resource's name from the journal or shard name it declares: lower case,
characters outside [a-z0-9.-] become "-". */}}
{{- define "gazette.resourceName" -}}
{{- regexReplaceAll "[^a-z0-9.-]+" (lower .) "-" | trunc 253 | trimAll "-." -}}
{{- end -}}
