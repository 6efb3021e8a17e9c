//go:build tools

// The program this module builds, imported so that go mod tidy keeps its dependencies.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
