{{/* The operator's names, scoped by release so that two releases never share them: its
objects' name, the namespaces it watches, its kopf peering object, and the finalizer it
puts on resources (docs/operator.md, "Two releases"). */}}

{{- define "gazette.operator.fullname" -}}
{{- printf "%s-operator" (include "gazette.fullname" .) -}}
{{- end -}}

{{/* The watched namespaces as a list: operator.watchNamespaces, else the release's
namespace; empty under operator.watchAllNamespaces (every namespace). */}}
{{- define "gazette.operator.namespaces" -}}
{{- if .Values.operator.watchAllNamespaces -}}
{{- list | toJson -}}
{{- else -}}
{{- .Values.operator.watchNamespaces | default (list .Release.Namespace) | toJson -}}
{{- end -}}
{{- end -}}

{{- define "gazette.operator.peeringName" -}}
{{- .Values.operator.peeringName | default (printf "%s-%s" .Release.Namespace (include "gazette.operator.fullname" .) | trunc 63 | trimSuffix "-") -}}
{{- end -}}

{{- define "gazette.operator.finalizer" -}}
{{- printf "%s.%s.gazette-py.dev/finalizer" .Release.Name .Release.Namespace -}}
{{- end -}}
