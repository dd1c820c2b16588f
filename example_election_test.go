package advisorylock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/advisorylock/advisorylock"
)

// One replica runs the outbox relay; the others wait to take over. Every
// replica runs this at start-up.
func ExampleElection_Run() {
	db := exampleDB()
	defer db.Close()

	election, err := advisorylock.NewElection(db, "outbox-relay/"+exampleID(), advisorylock.WithOwner("replica-a"))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = election.Run(ctx, func(ctx context.Context, term advisorylock.FencingToken) error {
		// Only the leader runs here, until ctx ends: leadership lost, or
		// Run's ctx cancelled. Pass term to a Fence with every write that
		// only the leader may make.
		leader, err := election.Leader(ctx)
		if err != nil {
			return err
		}
		fmt.Println("leading as", leader.Owner, "in term", leader.Token == term)
		cancel() // a service would relay until ctx ends; the example stops here
		<-ctx.Done()
		return ctx.Err()
	})
	fmt.Println("Run returned ctx's error:", errors.Is(err, context.Canceled))
	// Output:
	// leading as replica-a in term true
	// Run returned ctx's error: true
}

// A replica that does not lead follows who does.
func ExampleElection_Observe() {
	db := exampleDB()
	defer db.Close()
	name := "cache-warmer/" + exampleID()

	follower, err := advisorylock.NewElection(db, name)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaders := follower.Observe(ctx)
	fmt.Println("leader at first:", <-leaders)

	// Another replica campaigns and leads.
	other, err := advisorylock.NewElection(db, name, advisorylock.WithOwner("replica-b"))
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error)
	go func() {
		done <- other.Run(ctx, func(ctx context.Context, _ advisorylock.FencingToken) error {
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	fmt.Println("then:", (<-leaders).Owner)
	cancel()
	<-done
	for range leaders { // closed once Observe's goroutine has ended
	}
	// Output:
	// leader at first: <nil>
	// then: replica-b
}

// Stepping down: a leader that is about to drain (a deploy, a shutdown
// hook) resigns, so that another replica takes over at once; Run goes on
// campaigning until its own ctx ends.
func ExampleElection_Resign() {
	db := exampleDB()
	defer db.Close()
	election, err := advisorylock.NewElection(db, "report-scheduler/"+exampleID())
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	terms := 0
	err = election.Run(ctx, func(lead context.Context, _ advisorylock.FencingToken) error {
		terms++
		if terms == 2 {
			cancel() // leading again after the resignation: the example stops
			return nil
		}
		go func() {
			if err := election.Resign(ctx); err != nil {
				log.Print(err)
			}
		}()
		<-lead.Done() // Resign cancels the lead's context
		return lead.Err()
	})
	fmt.Println("terms:", terms, "Run returned ctx's error:", errors.Is(err, context.Canceled))
	// Output: terms: 2 Run returned ctx's error: true
}
