module github.com/advisorylock/advisorylock/extra/advisorylocktest

go 1.25.0

replace github.com/advisorylock/advisorylock => ../..

require (
	github.com/DATA-DOG/go-sqlmock v1.5.2
	github.com/advisorylock/advisorylock v0.1.0
	go.uber.org/goleak v1.3.0
)
