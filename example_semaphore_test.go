package advisorylock_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/advisorylock/advisorylock"
)

// At most three at once: eight workers, each with its own pool, rebuild
// their part of an index under a three-slot semaphore; never more than
// three rebuild at the same time.
func ExampleSemaphore_Do() {
	name := fmt.Sprintf("example-index-rebuild-%d", time.Now().UnixNano())
	var inside, most atomic.Int32
	rebuild := func(ctx context.Context) error {
		n := inside.Add(1)
		defer inside.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond) // the work
		return nil
	}
	var wg sync.WaitGroup
	for range 8 {
		db := exampleDB()
		defer db.Close()
		sem, err := advisorylock.NewSemaphore(db, name, 3)
		if err != nil {
			log.Fatal(err)
		}
		wg.Go(func() {
			if err := sem.Do(context.Background(), rebuild); err != nil {
				log.Fatal(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("at most three at once:", most.Load() <= 3)
	// Output: at most three at once: true
}

// Which slot: a holder's slot is its own until it releases it, so it can
// pick one of several resources, such as one of three scratch directories.
func ExampleGuard_Slot() {
	db := exampleDB()
	defer db.Close()
	sem, err := advisorylock.NewSemaphore(db, fmt.Sprintf("example-scratch-%d", time.Now().UnixNano()), 3)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	g, err := sem.TryAcquire(ctx)
	if err != nil {
		log.Fatal(err) // ErrNotAcquired when all three are taken
	}
	defer g.Release(ctx)
	dir := fmt.Sprintf("/scratch/%d", g.Slot())
	fmt.Println(len(dir) == len("/scratch/0"))
	// Output: true
}

// Which slot, inside Do: fn reads its slot from the guard in its context,
// so Do's handling of loss and release is kept while fn picks its
// resource.
func ExampleSemaphore_Do_slot() {
	db := exampleDB()
	defer db.Close()
	sem, err := advisorylock.NewSemaphore(db, fmt.Sprintf("example-workdirs-%d", time.Now().UnixNano()), 3)
	if err != nil {
		log.Fatal(err)
	}
	err = sem.Do(context.Background(), func(ctx context.Context) error {
		g := advisorylock.GuardFromContext(ctx)
		fmt.Println("holding a slot:", g != nil, g.Slot() >= 0 && g.Slot() < 3)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: holding a slot: true true
}
