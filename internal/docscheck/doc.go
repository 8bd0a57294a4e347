// Package docscheck holds no code, only a test that keeps the
// documentation honest: the README stays short and for users, every
// package of the module has its role in docs/architecture.md, and every
// relative link in the repository's markdown resolves to a file (and
// heading) inside the repository.
package docscheck
