{{/* TLS, authorization and etcd client TLS of the chart's processes: the values' checks,
where Secrets are mounted, the containers' env, volumes and probes, and the names
certificates must cover. Secrets are mounted as directories (never subPath, which a
Secret's update never reaches): a renewed certificate or rotated key is re-read by the
process without a restart. */}}

{{- define "gazette.tls.dir" -}}/etc/gazette/tls{{- end -}}
{{- define "gazette.auth.dir" -}}/etc/gazette/auth{{- end -}}
{{- define "gazette.etcd.clientTLSDir" -}}/etc/gazette/etcd-tls{{- end -}}
{{- define "gazette.etcd.serverTLSDir" -}}/etc/etcd/tls{{- end -}}

{{/* Values that only make sense together; each failure names the key to set. */}}
{{- define "gazette.security.validate" -}}
{{- $tls := .Values.tls -}}
{{- $cm := $tls.certManager -}}
{{- if and $tls.enabled (not $tls.secretName) (not $cm.enabled) -}}
{{- fail "tls.secretName: required when tls.enabled, unless tls.certManager.enabled (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt)" -}}
{{- end -}}
{{- if and $tls.clientAuth (not $tls.enabled) -}}
{{- fail "tls.clientAuth: needs tls.enabled (mutual TLS is TLS)" -}}
{{- end -}}
{{- if and $cm.enabled (not $cm.issuerRef.name) -}}
{{- fail "tls.certManager.issuerRef.name: required when tls.certManager.enabled (an Issuer or ClusterIssuer that puts ca.crt in its Secrets)" -}}
{{- end -}}
{{- if and .Values.auth.enabled (not .Values.auth.keysSecret) -}}
{{- fail "auth.keysSecret: required when auth.enabled (a Secret holding the signing keys; docs/kubernetes.md shows how to make one)" -}}
{{- end -}}
{{- if and .Values.auth.enabled (not .Values.auth.keysSecretKey) -}}
{{- fail "auth.keysSecretKey: required when auth.enabled (the key of auth.keysSecret holding the keys)" -}}
{{- end -}}
{{- if and .Values.consumer.enabled .Values.consumer.auth.tokenSecret (not .Values.consumer.auth.tokenSecretKey) -}}
{{- fail "consumer.auth.tokenSecretKey: required with consumer.auth.tokenSecret" -}}
{{- end -}}
{{- $etls := .Values.etcd.tls -}}
{{- if and $etls.enabled (not $cm.enabled) -}}
{{- if not $etls.secretName -}}
{{- fail "etcd.tls.secretName: required when etcd.tls.enabled, unless tls.certManager.enabled (etcd's server certificate, a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if not $etls.clientSecretName -}}
{{- fail "etcd.tls.clientSecretName: required when etcd.tls.enabled, unless tls.certManager.enabled (the client certificate brokers, consumers and the operator present to etcd)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The TLS Secret of a component: pass (dict "ctx" $ "fullname" <the component's
objects' name>). cert-manager's <fullname>-tls, else tls.secretName. */}}
{{- define "gazette.tls.secretName" -}}
{{- if .ctx.Values.tls.certManager.enabled -}}
{{- printf "%s-tls" .fullname -}}
{{- else -}}
{{- .ctx.Values.tls.secretName -}}
{{- end -}}
{{- end -}}

{{- define "gazette.etcd.serverSecret" -}}
{{- .Values.etcd.tls.secretName | default (printf "%s-tls" (include "gazette.etcd.fullname" .)) -}}
{{- end -}}

{{- define "gazette.etcd.clientSecret" -}}
{{- .Values.etcd.tls.clientSecretName | default (printf "%s-client-tls" (include "gazette.etcd.fullname" .)) -}}
{{- end -}}

{{/* A Secret volume: pass (dict "name" <volume> "secret" <Secret's name>). Readable by the
pod's fsGroup only. */}}
{{- define "gazette.secretVolume" -}}
{{- toYaml (dict "name" .name "secret" (dict "secretName" .secret "defaultMode" 288)) -}}
{{- end -}}

{{/* The names a certificate covers for Services: pass (dict "ctx" $ "services" <list of
Service names> "headless" <the headless Service whose pods are named under it>). Short,
namespaced, .svc and .svc.<clusterDomain> forms; *.<headless>.<ns>.svc[.<domain>]. */}}
{{- define "gazette.tls.dnsNames" -}}
{{- $ns := .ctx.Release.Namespace -}}
{{- $domain := .ctx.Values.clusterDomain -}}
{{- $names := list -}}
{{- range .services -}}
{{- $names = concat $names (list . (printf "%s.%s" . $ns) (printf "%s.%s.svc" . $ns) (printf "%s.%s.svc.%s" . $ns $domain)) -}}
{{- end -}}
{{- with .headless -}}
{{- $names = concat $names (list (printf "*.%s.%s.svc" . $ns) (printf "*.%s.%s.svc.%s" . $ns $domain)) -}}
{{- end -}}
{{- toYaml (uniq $names) -}}
{{- end -}}

{{/* The env of etcd's clients (brokers, consumers, the operator) under etcd.tls. */}}
{{- define "gazette.etcd.clientEnv" -}}
{{- if .Values.etcd.tls.enabled -}}
{{- $dir := include "gazette.etcd.clientTLSDir" . -}}
{{- toYaml (list
  (dict "name" "ETCD_CERT_FILE" "value" (printf "%s/tls.crt" $dir))
  (dict "name" "ETCD_KEY_FILE" "value" (printf "%s/tls.key" $dir))
  (dict "name" "ETCD_CA_FILE" "value" (printf "%s/ca.crt" $dir))) -}}
{{- end -}}
{{- end -}}

{{/* What a broker or consumer member needs of TLS, auth and etcd TLS: pass (dict "ctx" $
"fullname" <the component's objects' name> "keys" <mount the signing keys> "token" <the
AUTH_TOKEN Secret, or "">) to the three below. */}}
{{- define "gazette.member.securityEnv" -}}
{{- $v := .ctx.Values -}}
{{- $env := list -}}
{{- if $v.tls.enabled -}}
{{- $dir := include "gazette.tls.dir" . -}}
{{- $env = concat $env (list
  (dict "name" "TLS_CERT_FILE" "value" (printf "%s/tls.crt" $dir))
  (dict "name" "TLS_KEY_FILE" "value" (printf "%s/tls.key" $dir))
  (dict "name" "TLS_CA_FILE" "value" (printf "%s/ca.crt" $dir))
  (dict "name" "TLS_CLIENT_AUTH" "value" (toString $v.tls.clientAuth))) -}}
{{- end -}}
{{- if .keys -}}
{{- $env = append $env (dict "name" "AUTH_KEYS_FILE" "value" (printf "%s/%s" (include "gazette.auth.dir" .) $v.auth.keysSecretKey)) -}}
{{- end -}}
{{- if .token -}}
{{- $env = append $env (dict "name" "AUTH_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" .token "key" $v.consumer.auth.tokenSecretKey))) -}}
{{- end -}}
{{- with include "gazette.etcd.clientEnv" .ctx -}}
{{- $env = concat $env (fromYamlArray .) -}}
{{- end -}}
{{- with $env }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{- define "gazette.member.securityMounts" -}}
{{- $mounts := list -}}
{{- if .ctx.Values.tls.enabled -}}
{{- $mounts = append $mounts (dict "name" "tls" "mountPath" (include "gazette.tls.dir" .) "readOnly" true) -}}
{{- end -}}
{{- if .keys -}}
{{- $mounts = append $mounts (dict "name" "auth-keys" "mountPath" (include "gazette.auth.dir" .) "readOnly" true) -}}
{{- end -}}
{{- if .ctx.Values.etcd.tls.enabled -}}
{{- $mounts = append $mounts (dict "name" "etcd-tls" "mountPath" (include "gazette.etcd.clientTLSDir" .) "readOnly" true) -}}
{{- end -}}
{{- with $mounts }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{- define "gazette.member.securityVolumes" -}}
{{- $volumes := list -}}
{{- if .ctx.Values.tls.enabled -}}
{{- $volumes = append $volumes (include "gazette.secretVolume" (dict "name" "tls" "secret" (include "gazette.tls.secretName" .)) | fromYaml) -}}
{{- end -}}
{{- if .keys -}}
{{- $volumes = append $volumes (include "gazette.secretVolume" (dict "name" "auth-keys" "secret" .ctx.Values.auth.keysSecret) | fromYaml) -}}
{{- end -}}
{{- if .ctx.Values.etcd.tls.enabled -}}
{{- $volumes = append $volumes (include "gazette.secretVolume" (dict "name" "etcd-tls" "secret" (include "gazette.etcd.clientSecret" .ctx)) | fromYaml) -}}
{{- end -}}
{{- with $volumes }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* The shell line that starts a member whose advertised host is a DNS name: under
tls.enabled its certificate names it, not its IP, so a member advertises
<its IP, dots (or colons) as dashes>.<headless Service>.<ns>.svc, the record CoreDNS
keeps for each endpoint of a headless Service. Pass (dict "ctx" $ "hostVar" <BROKER_HOST
or CONSUMER_HOST> "headless" <the Service> "prefix" <assignments before it, or "">
"exec" <the command>). */}}
{{- define "gazette.member.shellCommand" -}}
{{- $assign := list -}}
{{- with .prefix }}{{ $assign = append $assign . }}{{ end -}}
{{- if .ctx.Values.tls.enabled -}}
{{- $assign = append $assign (printf "%s=\"$(echo \"$POD_IP\" | tr .: --).%s.%s.svc\"" .hostVar .headless .ctx.Release.Namespace) -}}
{{- end -}}
{{- printf "%s exec %s" (join " " $assign) .exec -}}
{{- end -}}

{{/* The mode of the members' probes: grpc (no TLS: the kubelet's gRPC probe), https
(GET /healthz over HTTPS) or exec (the container GETs /healthz with its own
certificate, as mutual TLS wants). */}}
{{- define "gazette.member.probeMode" -}}
{{- $tls := .Values.tls -}}
{{- if not $tls.enabled -}}
grpc
{{- else if eq $tls.probes "auto" -}}
{{- ternary "exec" "https" $tls.clientAuth -}}
{{- else -}}
{{- $tls.probes -}}
{{- end -}}
{{- end -}}

{{/* The exec probe's program (python -c): GET https://localhost:<port>/healthz with the
container's certificate, verifying the server with its CA but not its name (localhost);
a refusal, a 503 or a timeout raise, hence a non-zero exit. */}}
{{- define "gazette.member.probeScript" -}}
import os, ssl, urllib.request as u; c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); c.check_hostname = False; c.load_verify_locations(os.environ["TLS_CA_FILE"]); c.load_cert_chain(os.environ["TLS_CERT_FILE"], os.environ["TLS_KEY_FILE"]); u.urlopen("https://localhost:{{ . }}/healthz", context=c, timeout=4)
{{- end -}}

{{/* Startup, readiness and liveness probes of a member: pass (dict "ctx" $ "grpcPort"
<port> "httpPort" <port>). gRPC health and /healthz both say SERVING (200) once the
member holds its lease and serves, NOT_SERVING (503) while it drains, so clients move on
before it goes. */}}
{{- define "gazette.member.probes" -}}
{{- $mode := include "gazette.member.probeMode" .ctx -}}
{{- $check := dict "grpc" (dict "port" (int .grpcPort)) -}}
{{- if eq $mode "https" -}}
{{- $check = dict "httpGet" (dict "path" "/healthz" "port" "http" "scheme" "HTTPS") -}}
{{- else if eq $mode "exec" -}}
{{- $check = dict "exec" (dict "command" (list "python" "-c" (include "gazette.member.probeScript" .httpPort))) "timeoutSeconds" 5 -}}
{{- end -}}
startupProbe:
  {{- toYaml (merge (dict "periodSeconds" 2 "failureThreshold" 60) (deepCopy $check)) | nindent 2 }}
readinessProbe:
  {{- toYaml (merge (dict "periodSeconds" 5) (deepCopy $check)) | nindent 2 }}
livenessProbe:
  {{- toYaml (merge (dict "periodSeconds" 10 "timeoutSeconds" 5 "failureThreshold" 6) (deepCopy $check)) | nindent 2 }}
{{- end -}}

{{/* A cert-manager Certificate: pass (dict "ctx" $ "name" <its name and its Secret's>
"labels" <its labels' dict> "dnsNames" <list> "usages" <list> and optionally
"commonName", "ipAddresses"). */}}
{{- define "gazette.certificate" -}}
{{- $cm := .ctx.Values.tls.certManager -}}
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: {{ .name }}
  labels:
    {{- include "gazette.labels" .labels | nindent 4 }}
spec:
  secretName: {{ .name }}
  secretTemplate:
    labels:
      {{- include "gazette.labels" .labels | nindent 6 }}
  duration: {{ $cm.duration }}
  renewBefore: {{ $cm.renewBefore }}
  {{- with .commonName }}
  commonName: {{ . }}
  {{- end }}
  {{- with .dnsNames }}
  dnsNames:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .ipAddresses }}
  ipAddresses:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  privateKey:
    algorithm: ECDSA
    size: 256
    # A new key at every renewal.
    rotationPolicy: Always
  usages:
    {{- toYaml .usages | nindent 4 }}
  issuerRef:
    name: {{ $cm.issuerRef.name }}
    kind: {{ $cm.issuerRef.kind }}
    group: {{ $cm.issuerRef.group }}
{{- end -}}
