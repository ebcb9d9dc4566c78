package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/test/harness/devenv"
)

// The demo user of the gateway: a ServiceAccount bound to the operator
// role, whose token volplane-dev writes out.
const (
	adminNamespace = "default"
	adminAccount   = "volplane-admin"
	operatorRole   = "volplane-operator"
	viewerRole     = "volplane-viewer"
	tokenLifetime  = 24 * time.Hour
)

// gatewayCredential applies the ClusterRoles in rolesFile (or, when the
// file does not exist, the viewer and operator roles made here), binds
// the ServiceAccount default/volplane-admin to volplane-operator and writes
// a token for it to tokenPath, and binds the user certUser (the client
// certificate volplane-dev prints) to volplane-viewer.
func gatewayCredential(ctx context.Context, env *devenv.Env, rolesFile, tokenPath, certUser string) error {
	client, err := kubernetes.NewForConfig(env.RESTConfig)
	if err != nil {
		return err
	}
	roles, err := readClusterRoles(rolesFile)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Printf("%s not found: making the %s and %s ClusterRoles in code\n", rolesFile, viewerRole, operatorRole)
		roles = defaultRoles()
	} else if err != nil {
		return err
	}
	for _, r := range roles {
		if err := applyClusterRole(ctx, client, r); err != nil {
			return err
		}
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: adminNamespace, Name: adminAccount}}
	if _, err := client.CoreV1().ServiceAccounts(adminNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ServiceAccount %s/%s: %w", adminNamespace, adminAccount, err)
	}
	for _, b := range []*rbacv1.ClusterRoleBinding{{
		ObjectMeta: metav1.ObjectMeta{Name: adminAccount},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: operatorRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: adminNamespace, Name: adminAccount}},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: certUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: viewerRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: certUser}},
	}} {
		if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("bind %s to %s: %w", b.Subjects[0].Name, b.RoleRef.Name, err)
		}
	}
	secs := int64(tokenLifetime / time.Second)
	tr, err := client.CoreV1().ServiceAccounts(adminNamespace).CreateToken(ctx, adminAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("request a token for %s/%s: %w", adminNamespace, adminAccount, err)
	}
	return os.WriteFile(tokenPath, []byte(tr.Status.Token), 0o600)
}

// readClusterRoles decodes the ClusterRoles of a multi-document YAML file,
// skipping documents of other kinds.
func readClusterRoles(path string) ([]*rbacv1.ClusterRole, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var roles []*rbacv1.ClusterRole
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if u.GetKind() != "ClusterRole" {
			continue
		}
		var r rbacv1.ClusterRole
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
			return nil, fmt.Errorf("%s: ClusterRole %s: %w", path, u.GetName(), err)
		}
		roles = append(roles, &r)
	}
	if len(roles) == 0 {
		return nil, fmt.Errorf("%s holds no ClusterRole", path)
	}
	return roles, nil
}

// defaultRoles are the viewer and operator roles over volplane's API group.
func defaultRoles() []*rbacv1.ClusterRole {
	role := func(name string, verbs ...string) *rbacv1.ClusterRole {
		return &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"volplane.io"}, Resources: []string{"*"}, Verbs: verbs}},
		}
	}
	return []*rbacv1.ClusterRole{role(viewerRole, "get", "list", "watch"), role(operatorRole, "*")}
}

func applyClusterRole(ctx context.Context, client kubernetes.Interface, r *rbacv1.ClusterRole) error {
	_, err := client.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		old, gerr := client.RbacV1().ClusterRoles().Get(ctx, r.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		r.ResourceVersion = old.ResourceVersion
		_, err = client.RbacV1().ClusterRoles().Update(ctx, r, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("apply ClusterRole %s: %w", r.Name, err)
	}
	return nil
}
