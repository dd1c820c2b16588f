package advisorylock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/advisorylock/advisorylock"
)

// Readers and a writer: two shared holders of a name coexist, and a
// writer cannot take it until both have released it.
func ExampleLock_RLock() {
	ctx := context.Background()
	name := fmt.Sprintf("example-catalog-%d", os.Getpid())
	var closers []func() error
	defer func() {
		for _, c := range closers {
			_ = c()
		}
	}()
	open := func() *advisorylock.Lock {
		db := exampleDB() // each process has its own pool
		defer func() { closers = append(closers, db.Close) }()
		lock, err := advisorylock.New(db, name)
		if err != nil {
			log.Fatal(err)
		}
		return lock
	}
	reader1, reader2, writer := open(), open(), open()
	g1, err := reader1.RLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	g2, err := reader2.TryRLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	holders, err := writer.Holders(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("shared holders:", len(holders))
	_, err = writer.TryLock(ctx)
	fmt.Println("writer beside readers:", errors.Is(err, advisorylock.ErrNotAcquired))
	for _, g := range []*advisorylock.Guard{g1, g2} {
		if err := g.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}
	ran, err := writer.TryDo(ctx, func(ctx context.Context) error { return nil })
	fmt.Println("writer after readers left:", ran, err)
	// Output:
	// shared holders: 2
	// writer beside readers: true
	// writer after readers left: true <nil>
}
